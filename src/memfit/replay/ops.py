"""DeepSpeed's JIT-built ops (cpu_adam, fused_adam) and torch's build lock, never waited on forever.

``DeepSpeed OpBuilder.jit_load`` calls ``torch.utils.cpp_extension.load(name=...)``, which builds
in ``_get_build_directory(name)`` (``$TORCH_EXTENSIONS_DIR/<name>``, else
``~/.cache/torch_extensions/py<major><minor><abiflags>_<cpu|cuXYZ|rocmXYZ>/<name>``) under a
``FileBaton`` on ``<build directory>/lock`` (torch 2.13, torch/utils/cpp_extension.py
``_jit_compile``; torch/utils/file_baton.py). The baton is ``os.open(lock, O_CREAT | O_EXCL)``: the
builder keeps that file descriptor open until it removes the file in a ``finally``; every other
process polls until the file is gone, with no time limit. A builder killed with SIGKILL leaves the
file behind, and every later load on the machine waits forever.

So, before a replay loads an op (``load_op``):

- the lock file exists and no live process has it open (``/proc/*/fd``): it is **stale**;
  ``BuildLockError(kind="build_lock")`` says so in one line with the folder and the safe fix;
- a live process holds it (a build is running): wait, up to ``timeout_s``; on expiry
  ``BuildLockError(kind="build_lock_timeout")`` names the folder and the holder;
- while ``load()`` runs, a watcher thread does the same checks if this process ends up waiting in
  torch's own ``FileBaton.wait`` (another process took the lock first), and interrupts the wait.

``python -m memfit.replay.ops [--timeout S] OP...`` loads (JIT-building if needed) the named ops in
a guarded process (``memfit.replay.supervision``): exit status 0, or 3 with the one-line report.
"""

from __future__ import annotations

import _thread
import argparse
import os
import sys
import threading
import time
from dataclasses import dataclass

from memfit.replay.build_locks import lock_holders  # noqa: F401 - part of this module's interface

OPS = {"cpu_adam": "CPUAdamBuilder", "fused_adam": "FusedAdamBuilder", "deepspeed_shm_comm": "ShareMemCommBuilder"}
"""DeepSpeed ops the replays load (by builder ``NAME``): cpu_adam with an offloaded optimizer,
fused_adam without, and on the CPU accelerator the shared-memory collectives deepspeed.comm builds
when it starts (comm/torch.py ``build_shm_op``: ``ShareMemCommBuilder`` when compatible)."""
LOCK_TIMEOUT_ENV = "MEMFIT_BUILD_LOCK_TIMEOUT_S"
DEFAULT_LOCK_TIMEOUT_S = 600.0
STALE_RECHECK_S = 0.3
"""A lock seen without a holder is looked at again after this long (the builder closes its file
descriptor a moment before it removes the file)."""
EXIT_BUILD_LOCK = 3


class BuildLockError(RuntimeError):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(frozen=True, slots=True)
class LockState:
    path: str
    exists: bool
    holders: tuple[int, ...] = ()
    """Pids with the lock file open."""
    complete: bool = True
    """Every process's file descriptors could be read (else a holder may be hidden)."""

    @property
    def stale(self) -> bool:
        return self.exists and not self.holders and self.complete


def build_directory(op: str) -> str:
    """The folder torch builds ``op`` in (torch's own ``_get_build_directory``; creates it)."""
    from torch.utils.cpp_extension import _get_build_directory

    return _get_build_directory(op, verbose=False)


def lock_path(directory: str) -> str:
    return os.path.join(directory, "lock")


def lock_state(directory: str) -> LockState:
    path = lock_path(directory)
    if not os.path.exists(path):
        return LockState(path=path, exists=False)
    holders, complete = lock_holders(path)
    return LockState(path=path, exists=True, holders=holders, complete=complete)


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def stale_message(op: str, directory: str) -> str:
    return (f"stale build lock: {lock_path(directory)} is held by no live process (a build of DeepSpeed's {op} op "
            f"was killed); no build is running, so it is safe to remove: rm {lock_path(directory)}")


def timeout_message(op: str, directory: str, holders: tuple[int, ...], waited_s: float) -> str:
    who = ", ".join(f"pid {p} ({_cmdline(p)})" for p in holders) or "a process this user cannot inspect"
    return (f"build lock wait timed out after {waited_s:.0f} s: {lock_path(directory)} is held by {who}, which is "
            f"building DeepSpeed's {op} op; wait for it to finish, or stop it (its lock is then removed) and retry")


def _cmdline(pid: int, limit: int = 80) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            text = fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return "?"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_lock(op: str, directory: str, *, waited_s: float, timeout_s: float) -> LockState:
    """Raise ``BuildLockError`` when the lock is stale or the wait has run out; else the state."""
    state = lock_state(directory)
    if state.stale:
        ino = _inode(state.path)
        time.sleep(STALE_RECHECK_S)
        again = lock_state(directory)
        if again.stale and _inode(again.path) == ino:
            raise BuildLockError("build_lock", stale_message(op, directory))
        state = again
    if state.exists and waited_s >= timeout_s:
        raise BuildLockError("build_lock_timeout", timeout_message(op, directory, state.holders, waited_s))
    return state


def wait_for_lock(op: str, directory: str, timeout_s: float, *, poll_s: float = 0.5) -> float:
    """Wait until ``directory``'s lock is gone; returns the seconds waited (``BuildLockError`` on a
    stale lock or when ``timeout_s`` runs out)."""
    t0 = time.monotonic()
    while True:
        waited = time.monotonic() - t0
        if not check_lock(op, directory, waited_s=waited, timeout_s=timeout_s).exists:
            return waited
        time.sleep(poll_s)


def lock_timeout_s() -> float:
    try:
        return float(os.environ.get(LOCK_TIMEOUT_ENV, DEFAULT_LOCK_TIMEOUT_S))
    except ValueError:
        return DEFAULT_LOCK_TIMEOUT_S


EXPECTED_BUILD_CORE_S = {"cpu_adam": 600}
"""A first build's CPU time, core-seconds: cpu_adam took about 5 minutes on 2 cores here (README,
"Fresh machine"); the other ops have no measured figure."""


def _announce(record: dict) -> None:
    """Append ``record`` to the replay's progress file (``$MEMFIT_REPLAY_PROGRESS``), for the parent's
    display; nothing without one."""
    import json

    path = os.environ.get("MEMFIT_REPLAY_PROGRESS")
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
    except OSError:
        pass


def expected_build_s(op: str) -> float | None:
    """The expected wall time of a first build of ``op`` on this machine's cores, or None."""
    core_s = EXPECTED_BUILD_CORE_S.get(op)
    return None if core_s is None else core_s / max(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                                    else (os.cpu_count() or 1), 1)


def _built(directory: str, name: str) -> bool:
    return any(os.path.exists(os.path.join(directory, f"{name}{ext}")) for ext in (".so", ".pyd"))


def load_op(op: str, timeout_s: float | None = None):
    """``<Builder>().load()`` for ``op``, never waiting on the build lock for more than ``timeout_s``
    in all (default ``$MEMFIT_BUILD_LOCK_TIMEOUT_S`` or 600 s) nor on a stale one at all. The builder
    is the accelerator's (``create_op_builder``); an op it has none for, or one DeepSpeed reports
    incompatible here (``deepspeed.ops.__compatible_ops__``, as ``build_shm_op`` checks), is not
    loaded: None."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    timeout_s = lock_timeout_s() if timeout_s is None else timeout_s
    builder = get_accelerator().create_op_builder(OPS[op])
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, True):
        return None
    directory = build_directory(builder.name)
    t0 = time.monotonic()
    wait_for_lock(op, directory, timeout_s)
    failure: list[BuildLockError] = []
    done = threading.Event()
    me = os.getpid()

    def watch() -> None:  # torch's FileBaton.wait has no limit: interrupt it when we are in it
        while not done.wait(0.5):
            try:
                state = lock_state(directory)
                if not state.exists or me in state.holders:
                    continue  # free, or we are the builder (bounded by the replay's deadline)
                check_lock(op, directory, waited_s=time.monotonic() - t0, timeout_s=timeout_s)
            except BuildLockError as exc:
                if not done.is_set():
                    failure.append(exc)
                    _thread.interrupt_main()
                return

    watcher = threading.Thread(target=watch, name="memfit-build-lock-watch", daemon=True)
    watcher.start()
    building = not _built(directory, builder.name)
    _announce({"event": "op", "op": op, "state": "building" if building else "loading",
               "expected_s": expected_build_s(op) if building else None, "directory": directory})
    try:
        loaded = builder.load()
        _announce({"event": "op_done", "op": op, "seconds": round(time.monotonic() - t0, 1)})
        return loaded
    except KeyboardInterrupt:
        if failure:
            raise failure[0] from None
        raise
    finally:
        done.set()


def warm_ops(ops: tuple[str, ...] = ("cpu_adam", "fused_adam", "deepspeed_shm_comm"), *, timeout_s: float = 1800,
             lock_timeout_s: float | None = None) -> float:
    """Load (JIT-build if needed) DeepSpeed's CPU ``ops`` in a supervised child process
    (``python -m memfit.replay.ops``); returns its wall time in seconds.

    Its own process, so a build is never cut short inside a replay; supervised, so it dies with the
    caller and releases the build lock when stopped. Raises ``BuildLockError`` (one line: the
    folder and the safe fix, or the holder) or ``RuntimeError`` (the build failed or ran past
    ``timeout_s``)."""
    import subprocess
    import tempfile

    from memfit.replay.supervision import run_supervised

    argv = [sys.executable, "-m", "memfit.replay.ops", *ops]
    if lock_timeout_s is not None:
        argv += ["--timeout", f"{lock_timeout_s:g}"]
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as err:
        rc, timed_out = run_supervised(argv, env=env, timeout_s=timeout_s, stdout=subprocess.DEVNULL, stderr=err)
        err.seek(0)
        lines = err.read().decode("utf-8", "replace").strip().splitlines()
    wall = time.monotonic() - t0
    if timed_out:
        raise RuntimeError(f"loading DeepSpeed's {', '.join(ops)} op(s) ran past {timeout_s:g} s and was stopped")
    if rc == EXIT_BUILD_LOCK and lines:
        kind, _, message = lines[-1].partition(": ")
        raise BuildLockError(kind, message)
    if rc:
        raise RuntimeError(f"loading DeepSpeed's {', '.join(ops)} op(s) failed (exit {rc}): "
                           f"{lines[-1] if lines else 'no output'}")
    return wall


def main(argv: list[str] | None = None) -> int:
    from memfit.replay.supervision import Terminated, guard_process

    parser = argparse.ArgumentParser(prog="python -m memfit.replay.ops", description="Load (JIT-build) DeepSpeed ops.")
    parser.add_argument("ops", nargs="+", choices=sorted(OPS))
    parser.add_argument("--timeout", type=float, default=None, help="seconds to wait for another build's lock")
    args = parser.parse_args(argv)
    guard_process()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        for op in args.ops:
            try:
                load_op(op, args.timeout)
            except BuildLockError as exc:
                print(f"{exc.kind}: {exc.message}", file=sys.stderr)
                return EXIT_BUILD_LOCK
    except Terminated:
        return 143  # unwound: a build this process ran released its lock
    return 0


if __name__ == "__main__":
    sys.exit(main())
