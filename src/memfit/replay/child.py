"""The replay child: ``python -m memfit.replay.child SPEC.json OUT.json`` runs one replay recipe in its
own process and writes its ``Measurement`` to OUT.json. The recipe is the spec's framework's:
``memfit.replay.deepspeed.child.ChildRun`` for DeepSpeed, ``memfit.replay.pytorch.child.TorchChildRun``
for a plain PyTorch loop, DDP, FSDP and FSDP2.

With ``launcher="torchrun"`` the same command runs once per rank under
``python -m torch.distributed.run``; rank 0 writes OUT.json and rank r > 0 writes its own
measurement to ``rank_output_path(OUT.json, r)`` (OUT.rank1.json ...), each with its own progress
log beside it. A rank that fails writes its result and exits with status 1, so torchrun stops the
peers that would otherwise wait for it in a collective until the process group's timeout.

Any exception is caught with the phase it happened in and written to OUT.json like a success; a
phase log (OUT.json.progress) lets the parent name the phase even when the process is killed.
A SIGTERM (the deadline, torchrun stopping the peers of a failed rank, the supervisor's death)
unwinds the run and ends the process group without a result, as a kill would
(``memfit.replay.supervision``); a stale or long-held op build lock ends the run before ``load``
with ``ReplayError.kind`` ``build_lock`` or ``build_lock_timeout`` (``memfit.replay.ops``).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import signal
import sys

from memfit.replay.measurement import rank_output_path
from memfit.replay.spec import ReplaySpec
from memfit.replay.supervision import Terminated, end_own_group, guard_process


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 2:
        print("usage: python -m memfit.replay.child SPEC.json OUT.json", file=sys.stderr)
        return 2
    guard_process()
    try:
        return _main(*argv)
    except Terminated:
        # Unwound (build locks released by their ``finally``); what this process started goes
        # with it, and it ends by SIGTERM as before, so torchrun reports the signal.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        end_own_group(signal.SIGTERM)
        return 143


def _main(spec_path: str, out_path: str) -> int:
    argv = [spec_path, out_path]
    with open(spec_path, encoding="utf-8") as fh:
        spec = ReplaySpec.from_json(fh.read())
    if spec.launcher == "torchrun":
        # One spec file for every rank; each records the rank it played.
        spec = dataclasses.replace(spec, rank=int(os.environ.get("RANK", "0")))
        out_path = rank_output_path(out_path, spec.rank)
    command = shlex.join([sys.executable, "-m", "memfit.replay.child", *argv])
    if spec.framework != "deepspeed":
        from memfit.replay.pytorch.child import TorchChildRun as Run
    else:
        from memfit.replay.deepspeed.child import ChildRun as Run
    run = Run(spec, progress_path=out_path + ".progress", command=command)
    measurement = run.execute()
    tmp = out_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(measurement.to_json())
    os.replace(tmp, out_path)
    if spec.launcher == "torchrun" and measurement.error is not None:
        return 1  # torchrun then stops the peers (they may be waiting for this rank in a collective)
    return 0


if __name__ == "__main__":
    sys.exit(main())
