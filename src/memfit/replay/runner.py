"""Run a replay in a supervised child process and collect its ``Measurement``.

Command line: ``python -m memfit.replay.runner SPEC.json [--save-fixture PATH] [--overwrite]
[--timeout S]`` prints a one-line summary per phase and optionally saves the measurement.

The parent never imports torch or deepspeed: it writes the spec to a temporary directory, starts
``python -m memfit.replay.child SPEC.json OUT.json`` in its own process group, waits up to
``timeout_s``, and reads OUT.json. When the child dies without writing it (killed by a signal, such
as the kernel OOM killer's SIGKILL, or by the timeout) the parent builds the measurement from the
child's progress log: the phases it closed and the phase it was in.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time

from memfit.replay.measurement import Measurement, ReplayError, save_fixture
from memfit.replay.phases import read_progress
from memfit.replay.spec import ReplaySpec

STDERR_TAIL_CHARS = 4000


def run_replay(
    spec: ReplaySpec,
    *,
    timeout_s: float = 900,
    python: str | None = None,
    keep_dir: str | None = None,
    env: dict[str, str] | None = None,
) -> Measurement:
    """Run ``spec`` in a child process; never raises for a failed run (see ``Measurement.error``).

    ``keep_dir``: write spec, output, progress log and the child's stdout/stderr there (else a
    temporary directory, removed afterwards). ``env``: extra environment for the child.
    """
    workdir = keep_dir or tempfile.mkdtemp(prefix="memfit-replay-")
    os.makedirs(workdir, exist_ok=True)
    spec_path = os.path.join(workdir, "spec.json")
    out_path = os.path.join(workdir, "out.json")
    progress_path = out_path + ".progress"
    for stale in (out_path, progress_path):
        if os.path.exists(stale):
            os.remove(stale)
    with open(spec_path, "w", encoding="utf-8") as fh:
        fh.write(spec.to_json())
    argv = [python or sys.executable, "-m", "memfit.replay.child", spec_path, out_path]
    child_env = dict(os.environ)
    child_env.update(env or {})
    child_env["DS_ACCELERATOR"] = spec.accelerator
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    t0 = time.perf_counter()
    stdout_path = os.path.join(workdir, "stdout.txt")
    stderr_path = os.path.join(workdir, "stderr.txt")
    timed_out = False
    with open(stdout_path, "wb") as out_fh, open(stderr_path, "wb") as err_fh:
        proc = subprocess.Popen(argv, stdout=out_fh, stderr=err_fh, env=child_env, start_new_session=True)
        try:
            returncode = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            returncode = proc.wait()
    wall = time.perf_counter() - t0
    try:
        measurement = _collect(spec, argv, out_path, progress_path, stderr_path, returncode, timed_out, timeout_s, wall)
    finally:
        if keep_dir is None:
            _remove_tree(workdir)
    return measurement


def _collect(spec, argv, out_path, progress_path, stderr_path, returncode, timed_out, timeout_s, wall) -> Measurement:
    from dataclasses import replace

    unreadable = None
    if os.path.exists(out_path) and not timed_out:
        try:
            with open(out_path, encoding="utf-8") as fh:
                measurement = Measurement.from_json(fh.read())
            return replace(measurement, returncode=returncode, command=shlex.join(argv))
        except (ValueError, TypeError, KeyError) as exc:
            unreadable = f"{type(exc).__name__}: {exc}"
    phase, phases = read_progress(progress_path)
    tail = _tail(stderr_path)
    if unreadable:
        error = ReplayError(phase=phase, kind="crash", message=f"unreadable child result: {unreadable}", traceback=tail)
    elif timed_out:
        error = ReplayError(phase=phase, kind="timeout", message=f"replay exceeded {timeout_s:g} s", traceback=tail)
    elif returncode is not None and returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.Signals._value2member_map_ else str(-returncode)
        error = ReplayError(phase=phase, kind="killed", message=f"child killed by {name}", traceback=tail)
    else:
        error = ReplayError(phase=phase, kind="crash", message=f"child exited with code {returncode} without a result",
                            traceback=tail)
    return Measurement(
        spec=spec, deepspeed_config_used=dict(spec.deepspeed_config), versions={}, command=shlex.join(argv),
        phases=phases, error=error, wall_s=round(wall, 3), returncode=returncode,
        notes=("partial: phases from the child's progress log (no host tracker numbers)",),
    )


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the child's process group (its session), then SIGKILL after 5 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - STDERR_TAIL_CHARS))
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
