"""Run a replay in a supervised child process and collect its ``Measurement``.

Command line: ``python -m memfit.replay.runner SPEC.json [--save-fixture PATH] [--overwrite]
[--timeout S]`` prints a one-line summary per phase and optionally saves the measurement.

The parent never imports torch or deepspeed: it writes the spec to a temporary directory, starts
``python -m memfit.replay.child SPEC.json OUT.json`` in its own session, waits up to
``timeout_s``, and reads OUT.json. The child dies with the parent, however the parent dies
(``memfit.replay.supervision``: a parent-death signal, a watchdog in every replay process); a
build lock left by a killed op build is reported, not waited on (``memfit.replay.ops``). When the child dies without writing it (killed by a signal, such
as the kernel OOM killer's SIGKILL, or by the timeout) the parent builds the measurement from the
child's progress log: the phases it closed and the phase it was in.

With ``spec.launcher == "torchrun"`` the child command is ``python -m torch.distributed.run
--standalone --nproc_per_node W -m memfit.replay.child SPEC.json OUT.json``: W processes on this
host, each running the whole recipe on a real process group. Rank 0's OUT.json is the result; the
other ranks' measurements (OUT.rankR.json, see ``memfit.replay.measurement.rank_output_path``) are read
for their errors and returned by ``run_replay_ranks``. torchrun starts each worker in a session of
its own, so the deadline kill signals torchrun's session and every descendant's process group.
When rank 0 left no result, the error is, in order: the deadline; the error another rank reported;
torchrun's root cause (its failure summary's first failed rank and exit code: a negative code is a
signal, ``killed``); else ``crash``.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import sys
import tempfile
import time

from memfit.errors import MemfitError
from memfit.replay import supervision
from memfit.replay.measurement import Measurement, ReplayError, rank_output_path, save_fixture
from memfit.replay.ops import LOCK_TIMEOUT_ENV
from memfit.replay.phases import read_progress
from memfit.replay.spec import ReplaySpec
from memfit.replay.supervision import KILL_GRACE_S, run_supervised  # noqa: F401 (KILL_GRACE_S: public name)

STDERR_TAIL_CHARS = 4000
LOCK_TIMEOUT_SHARE = 0.5
"""Default share of the replay's timeout that the child may wait for another process's op build."""
TORCHRUN_SUMMARY_CHARS = 65536
"""How much of the end of stderr is searched for torchrun's failure summary."""

_ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.DOTALL
)
"""torchrun's failure summary (torch/distributed/elastic/multiprocessing/errors/__init__.py,
``_FAILURE_FORMAT_TEMPLATE``): the root-cause rank and its exit code."""


def child_argv(spec: ReplaySpec, spec_path: str, out_path: str, python: str | None = None) -> list[str]:
    """The command that runs ``spec``: the child itself (``fake``) or torchrun starting W of them."""
    exe = python or sys.executable
    child = ["-m", "memfit.replay.child", spec_path, out_path]
    if spec.launcher == "torchrun":
        return [exe, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(spec.world_size), *child]
    return [exe, *child]


def run_replay(
    spec: ReplaySpec,
    *,
    timeout_s: float = 900,
    python: str | None = None,
    keep_dir: str | None = None,
    env: dict[str, str] | None = None,
    lock_timeout_s: float | None = None,
    on_progress=None,
) -> Measurement:
    """Run ``spec`` in a child process; never raises for a failed run (see ``Measurement.error``).

    ``keep_dir``: write spec, output, progress log and the child's stdout/stderr there (else a
    temporary directory, removed afterwards). ``env``: extra environment for the child. With the
    ``torchrun`` launcher the result is rank 0's measurement; other ranks' errors are added to its
    notes (and become its error when rank 0 has none). ``on_progress(record)``: called with each
    record the child appends to its progress file (``{"event": "op", ...}`` while a DeepSpeed op
    loads or builds, ``enter``/``close`` per phase) as it appears. ``lock_timeout_s``: how long the child may
    wait for another process's build of a DeepSpeed op (default: half of ``timeout_s``); a stale
    build lock is reported at once (``ReplayError.kind`` ``build_lock``, ``build_lock_timeout``).
    """
    return run_replay_ranks(spec, timeout_s=timeout_s, python=python, keep_dir=keep_dir, env=env,
                            lock_timeout_s=lock_timeout_s, on_progress=on_progress)[0]


PROGRESS_ENV = "MEMFIT_REPLAY_PROGRESS"
"""The progress file the child's op loading appends to (``memfit.replay.ops.load_op``)."""


class _ProgressTail:
    """The records a child appended to its progress file since the last look."""

    def __init__(self, path: str, callback) -> None:
        self.path, self.callback, self.offset = path, callback, 0

    def __call__(self) -> None:
        import json

        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1  # only whole lines: the child may be writing one
        self.offset += end
        for line in data[:end].decode("utf-8", "replace").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                self.callback(record)


def run_replay_ranks(
    spec: ReplaySpec,
    *,
    timeout_s: float = 900,
    python: str | None = None,
    keep_dir: str | None = None,
    env: dict[str, str] | None = None,
    lock_timeout_s: float | None = None,
    on_progress=None,
) -> tuple[Measurement, ...]:
    """``run_replay``, returning rank 0's measurement followed by those the other ranks wrote
    (``torchrun``; a rank that wrote none is left out). The ``fake`` launcher returns one."""
    if spec.launcher == "torchrun" and spec.rank != 0:
        raise MemfitError(f"replay spec: the torchrun launcher runs every rank and reports rank 0; got rank {spec.rank}")
    workdir = keep_dir or tempfile.mkdtemp(prefix="memfit-replay-")
    os.makedirs(workdir, exist_ok=True)
    spec_path = os.path.join(workdir, "spec.json")
    out_path = os.path.join(workdir, "out.json")
    progress_path = out_path + ".progress"
    for rank in range(spec.world_size if spec.launcher == "torchrun" else 1):
        for stale in (rank_output_path(out_path, rank), rank_output_path(out_path, rank) + ".progress"):
            if os.path.exists(stale):
                os.remove(stale)
    with open(spec_path, "w", encoding="utf-8") as fh:
        fh.write(spec.to_json())
    argv = child_argv(spec, spec_path, out_path, python)
    child_env = dict(os.environ)
    child_env.update(env or {})
    child_env["DS_ACCELERATOR"] = spec.accelerator
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    lock_wait = timeout_s * LOCK_TIMEOUT_SHARE if lock_timeout_s is None else lock_timeout_s
    child_env[LOCK_TIMEOUT_ENV] = f"{max(lock_wait, 0.0):g}"
    child_env[PROGRESS_ENV] = progress_path
    t0 = time.perf_counter()
    stdout_path = os.path.join(workdir, "stdout.txt")
    stderr_path = os.path.join(workdir, "stderr.txt")
    with open(stdout_path, "wb") as out_fh, open(stderr_path, "wb") as err_fh:
        tail = _ProgressTail(progress_path, on_progress) if on_progress is not None else None
        returncode, timed_out = run_supervised(argv, env=child_env, timeout_s=timeout_s, stdout=out_fh, stderr=err_fh,
                                               tick=tail)
        if tail is not None:
            tail()
    wall = time.perf_counter() - t0
    try:
        others = _other_ranks(spec, out_path) if not timed_out else ()
        measurement = _collect(spec, argv, out_path, progress_path, stderr_path, returncode, timed_out, timeout_s, wall,
                               others)
    finally:
        if keep_dir is None:
            _remove_tree(workdir)
    return (measurement, *(m for _, m in others))


def _other_ranks(spec: ReplaySpec, out_path: str) -> tuple[tuple[int, Measurement], ...]:
    """(rank, measurement) of every rank > 0 that wrote a readable result (torchrun)."""
    if spec.launcher != "torchrun":
        return ()
    found = []
    for rank in range(1, spec.world_size):
        try:
            with open(rank_output_path(out_path, rank), encoding="utf-8") as fh:
                found.append((rank, Measurement.from_json(fh.read())))
        except (OSError, ValueError, TypeError, KeyError):
            continue
    return tuple(found)


def _rank_error(rank: int, error: ReplayError) -> ReplayError:
    return ReplayError(phase=error.phase, kind=error.kind, message=f"rank {rank}: {error.message}",
                       traceback=error.traceback)


def _torchrun_root_cause(spec: ReplaySpec, out_path: str, stderr_path: str) -> ReplayError | None:
    """The first failed rank torchrun reports, with the phase its progress log was in."""
    found = _ROOT_CAUSE.search(_tail(stderr_path, TORCHRUN_SUMMARY_CHARS))
    if not found:
        return None
    rank, code = int(found.group(1)), int(found.group(2))
    phase, _ = read_progress(rank_output_path(out_path, rank) + ".progress")
    tail = _tail(stderr_path)
    if code < 0:
        return ReplayError(phase=phase, kind="killed", message=f"rank {rank} killed by {_signal_name(-code)}",
                           traceback=tail)
    return ReplayError(phase=phase, kind="crash", message=f"rank {rank} exited with code {code} without a result",
                       traceback=tail)


def _signal_name(number: int) -> str:
    return signal.Signals(number).name if number in signal.Signals._value2member_map_ else str(number)


def _collect(spec, argv, out_path, progress_path, stderr_path, returncode, timed_out, timeout_s, wall,
             others=()) -> Measurement:
    from dataclasses import replace

    failed = [(rank, m.error) for rank, m in others if m.error is not None]
    unreadable = None
    if os.path.exists(out_path) and not timed_out:
        try:
            with open(out_path, encoding="utf-8") as fh:
                measurement = Measurement.from_json(fh.read())
        except (ValueError, TypeError, KeyError) as exc:
            unreadable = f"{type(exc).__name__}: {exc}"
        else:
            error = measurement.error
            if error is None and failed:
                error = _rank_error(*failed[0])
            elif error is None and spec.launcher == "torchrun" and returncode:
                error = _torchrun_root_cause(spec, out_path, stderr_path) or ReplayError(
                    phase=None, kind="crash", message=f"torchrun exited with code {returncode}", traceback=_tail(stderr_path))
            notes = measurement.notes + tuple(f"rank {r}: {e.kind} in {e.phase}: {e.message.splitlines()[0] if e.message else ''}"
                                              for r, e in failed)
            return replace(measurement, returncode=returncode, command=shlex.join(argv), error=error, notes=notes)
    phase, phases = read_progress(progress_path)
    tail = _tail(stderr_path)
    root = None
    if not (unreadable or timed_out) and spec.launcher == "torchrun":
        root = _rank_error(*failed[0]) if failed else _torchrun_root_cause(spec, out_path, stderr_path)
    if root is not None:
        error = root
    elif unreadable:
        error = ReplayError(phase=phase, kind="crash", message=f"unreadable child result: {unreadable}", traceback=tail)
    elif timed_out:
        error = ReplayError(phase=phase, kind="timeout", message=f"replay exceeded {timeout_s:g} s", traceback=tail)
    elif returncode is not None and returncode < 0:
        error = ReplayError(phase=phase, kind="killed", message=f"child killed by {_signal_name(-returncode)}",
                            traceback=tail)
    else:
        error = ReplayError(phase=phase, kind="crash", message=f"child exited with code {returncode} without a result",
                            traceback=tail)
    return Measurement(
        spec=spec, deepspeed_config_used=dict(spec.deepspeed_config), versions={}, command=shlex.join(argv),
        phases=phases, error=error, wall_s=round(wall, 3), returncode=returncode,
        notes=("partial: phases from the child's progress log (no host tracker numbers)",),
    )


_stat_fields = supervision.stat_fields
_start_time = supervision.start_time
_descendants = supervision.descendants


def _tail(path: str, chars: int = STDERR_TAIL_CHARS) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - chars))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _remove_tree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memfit.replay.runner", description="Run one replay spec.")
    parser.add_argument("spec", help="ReplaySpec JSON file")
    parser.add_argument("--save-fixture", metavar="PATH", help="write the Measurement JSON here")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --save-fixture file")
    parser.add_argument("--timeout", type=float, default=900, help="seconds before the child is killed")
    args = parser.parse_args(argv)
    with open(args.spec, encoding="utf-8") as fh:
        spec = ReplaySpec.from_json(fh.read())
    if args.save_fixture and os.path.exists(args.save_fixture) and not args.overwrite:
        parser.error(f"{args.save_fixture} exists; pass --overwrite to replace it")
    measurement = run_replay(spec, timeout_s=args.timeout)
    for p in measurement.phases:
        step = "" if p.step is None else f"[{p.step}]"
        print(f"{p.name}{step}: host peak {p.host_peak_bytes} B, pinned {p.host_peak_pinned_bytes} B, "
              f"rss peak {p.rss_peak_bytes} B, device peak {p.device_peak_allocated_bytes} B")
    if measurement.error:
        print(f"error: {measurement.error.kind} in {measurement.error.phase}: {measurement.error.message}",
              file=sys.stderr)
    if args.save_fixture:
        save_fixture(measurement, args.save_fixture, overwrite=args.overwrite)
    return 0 if measurement.ok else 1


if __name__ == "__main__":
    sys.exit(main())
