"""A replay never outlives the process that supervises it.

Three layers, so every descendant dies however the supervisor dies (SIGKILL included):

1. **Parent-death signal on the direct child.** ``supervised_argv`` prefixes the child's command
   with a tiny trampoline (``python -I -S -c TRAMPOLINE``) that calls ``prctl(PR_SET_PDEATHSIG,
   SIGTERM)`` and then checks that its parent is still the supervisor's pid (if the supervisor died
   between ``fork`` and ``prctl``, the signal would never come: the trampoline exits at once), and
   only then ``execv``\\ s the real command. The setting survives ``execve`` (prctl(2)). A
   trampoline instead of ``Popen(preexec_fn=...)``: ``memfit replay`` runs a spinner thread while
   it waits, and ``preexec_fn`` is not safe in a process with threads (subprocess docs).
   The kernel sends the signal when the *thread* that forked the child exits; ``run_replay`` forks
   and waits on the same thread, so that thread outlives the child.
2. **A watchdog thread in every replay process** (``start_watchdog``): the child, each torchrun
   worker, the op builder. torchrun starts its workers in sessions of their own without a
   parent-death signal (torch/distributed/elastic/multiprocessing/subprocess_handler/
   subprocess_handler.py, ``SubprocessHandler._popen``: ``start_new_session=True``), so a worker
   would outlive a killed torchrun. The watchdog polls the supervisor named in
   ``MEMFIT_REPLAY_SUPERVISOR`` (pid and start time, so a recycled pid is not mistaken for it) and
   the process's own parent; when either is gone it sends SIGTERM to its own process, and after
   ``WATCHDOG_GRACE_S`` SIGKILLs its process group (or itself when it leads none).
3. **SIGTERM unwinds** (``install_sigterm_handler``): the first SIGTERM raises ``Terminated`` in the
   main thread, so ``finally`` blocks run. torch's JIT build lock (``FileBaton``, released in a
   ``finally`` of ``torch.utils.cpp_extension._jit_compile``) is thereby removed instead of being
   left stale. The child then ends its whole process group (``end_own_group``), which takes a
   ``ninja`` or compiler it started with it.

The child keeps its own session (``start_new_session=True``) so a deadline can still stop a whole
group at once (``_kill_tree``). ``run_supervised`` starts a command this way and waits for it, up to
a deadline (the replay runner, the op builder).

A build that a deadline stops leaves no lock behind: ``_kill_tree`` notes the torch build locks the
stopped processes hold before its first signal and, once they are gone, removes those no live
process holds (``memfit.replay.build_locks.release_orphaned``); a watchdog removes its own process's
locks before its SIGKILL. Only locks of processes memfit stopped: one it finds is reported, never
removed.

Pure Python, no torch: the parent side imports this.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

SUPERVISOR_ENV = "MEMFIT_REPLAY_SUPERVISOR"
"""``PID:START`` of the supervising process (start time in clock ticks since boot, proc(5) field 22)."""
WATCHDOG_POLL_S = 0.2
WATCHDOG_GRACE_S = 3.0
"""Seconds between the watchdog's SIGTERM and its SIGKILL of the process group."""
KILL_GRACE_S = 5.0
"""Seconds between SIGTERM and SIGKILL when a replay is stopped."""
PR_SET_PDEATHSIG = 1
"""linux/prctl.h."""

TRAMPOLINE = (
    "import ctypes,os,sys\n"
    "ppid,sig=int(sys.argv[1]),int(sys.argv[2])\n"
    "libc=ctypes.CDLL(None,use_errno=True)\n"
    "if libc.prctl(1,sig,0,0,0)!=0:\n"
    "    sys.exit('memfit: prctl(PR_SET_PDEATHSIG) failed: errno %d' % ctypes.get_errno())\n"
    "if os.getppid()!=ppid:\n"
    "    os._exit(143)\n"
    "os.execv(sys.argv[3],sys.argv[3:])\n"
)
"""Arm the parent-death signal, check the parent is still the supervisor, then exec the command.
Runs with ``-I -S`` (no site, no user paths): only ctypes and os from the standard library."""


class Terminated(BaseException):
    """Raised in the main thread by the first SIGTERM (a deadline, the supervisor's death)."""


def has_pdeathsig() -> bool:
    return sys.platform.startswith("linux")


def supervised_argv(argv: list[str], *, sig: int = signal.SIGTERM, python: str | None = None) -> list[str]:
    """``argv`` started through the parent-death trampoline (Linux; elsewhere ``argv`` itself).

    The child receives ``sig`` when the calling thread's process dies. ``argv[0]`` must be a path
    (it is ``execv``'d without a PATH search)."""
    if not has_pdeathsig():
        return list(argv)
    return [python or sys.executable, "-I", "-S", "-c", TRAMPOLINE, str(os.getpid()), str(int(sig)), *argv]


def supervisor_token(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{start_time(pid) or 0}"


# -- /proc ------------------------------------------------------------------------------------
def stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (field 3, the state, first); None if gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (proc(5) field 22), None when it is gone."""
    fields = stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def alive(pid: int, started: int | None = None) -> bool:
    """``pid`` runs (not a zombie) and, when ``started`` is given, is the process started then."""
    fields = stat_fields(pid)
    if fields is None:
        if os.path.isdir("/proc/self"):
            return False
        try:  # no /proc (not Linux): existence only
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if fields[0] in ("Z", "X"):
        return False
    return not started or (len(fields) > 19 and int(fields[19]) == started)


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (through /proc's parent pids; empty where /proc is missing)."""
    children: dict[int, list[int]] = {}
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []
    for pid in pids:
        fields = stat_fields(pid)
        if fields and len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(pid)
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


# -- in the replay processes -------------------------------------------------------------------
_terminated = threading.Event()


def terminated() -> bool:
    """A SIGTERM arrived (or the watchdog saw the supervisor die)."""
    return _terminated.is_set()


def install_sigterm_handler() -> None:
    """The first SIGTERM raises ``Terminated`` in the main thread; later ones are ignored (the
    watchdog's SIGKILL bounds the unwinding)."""

    def handler(signum, frame):  # noqa: ARG001
        if _terminated.is_set():
            return
        _terminated.set()
        raise Terminated(f"terminated by {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, handler)


def _parse_token(token: str | None) -> tuple[int, int] | None:
    if not token:
        return None
    pid, _, started = token.partition(":")
    try:
        return int(pid), int(started or 0)
    except ValueError:
        return None


def group_members(pgid: int) -> list[int]:
    """Pids in process group ``pgid`` (proc(5) field 5), through /proc."""
    out = []
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return out
    for pid in pids:
        fields = stat_fields(pid)
        if fields and len(fields) > 2 and int(fields[2]) == pgid:
            out.append(pid)
    return out


def end_own_group(sig: int = signal.SIGKILL) -> None:
    """SIGKILL the other members of this process's group when it leads one (its own session, as the
    runner and torchrun start replay processes; never a group it merely joined, such as a shell
    job), then send ``sig`` to this process."""
    me = os.getpid()
    if os.getpgrp() == me:
        for pid in group_members(me):
            if pid != me:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
    os.kill(me, sig)


def start_watchdog(token: str | None = None, *, poll_s: float = WATCHDOG_POLL_S,
                   grace_s: float = WATCHDOG_GRACE_S) -> threading.Thread | None:
    """Watch the supervisor (``token``, default ``$MEMFIT_REPLAY_SUPERVISOR``) and this process's
    parent; when either dies: SIGTERM to this process, then after ``grace_s`` SIGKILL to its group.
    Returns the daemon thread, or None when there is no supervisor to watch."""
    parsed = _parse_token(token if token is not None else os.environ.get(SUPERVISOR_ENV))
    if parsed is None:
        return None
    sup_pid, sup_start = parsed
    parent = os.getppid()

    def gone() -> str | None:
        if not alive(sup_pid, sup_start or None):
            return f"supervisor {sup_pid} is gone"
        if os.getppid() != parent:
            return f"parent {parent} is gone"
        return None

    def watch() -> None:
        while True:
            why = gone()
            if why is not None:
                break
            time.sleep(poll_s)
        print(f"memfit replay: {why}; stopping", file=sys.stderr, flush=True)
        if not _terminated.is_set():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
            except OSError:
                pass
        time.sleep(grace_s)
        from memfit.replay.build_locks import release_own

        release_own()  # its build dies with it: no stale lock for the next one
        end_own_group(signal.SIGKILL)

    thread = threading.Thread(target=watch, name="memfit-replay-watchdog", daemon=True)
    thread.start()
    return thread


def guard_process() -> None:
    """What every replay process does first: unwind on SIGTERM, watch the supervisor."""
    install_sigterm_handler()
    start_watchdog()



TICK_S = 0.5
"""How often ``run_supervised`` calls its ``tick`` while the child runs."""


def run_supervised(argv: list[str], *, env: dict[str, str], timeout_s: float | None, stdout=None,
                   stderr=None, tick=None) -> tuple[int, bool]:
    """Run ``argv`` as a supervised child: in its own session, killed with its descendants when this
    process dies (``supervision``), stopped at ``timeout_s``. Returns (returncode, timed_out).
    ``tick()`` is called every ``TICK_S`` while it runs (the replay's progress display)."""
    import time

    env = dict(env)
    env[SUPERVISOR_ENV] = supervisor_token()
    proc = subprocess.Popen(supervised_argv(argv), stdout=stdout, stderr=stderr, env=env,
                            start_new_session=True)
    try:
        if tick is None:
            return proc.wait(timeout=timeout_s), False
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(argv, timeout_s)
            try:
                return proc.wait(timeout=TICK_S if left is None else min(TICK_S, left)), False
            except subprocess.TimeoutExpired:
                if left is not None and left <= TICK_S:
                    raise
                tick()
    except subprocess.TimeoutExpired:
        _kill_tree(proc, env)
        return proc.wait(), True
    except BaseException:  # KeyboardInterrupt in the supervisor: the child goes with it
        _kill_tree(proc, env)
        proc.wait()
        raise


def _kill_tree(proc: subprocess.Popen, env: dict[str, str] | None = None) -> None:
    """SIGTERM the child's process group (its session) and those of all its descendants, then
    SIGKILL the groups still there after ``KILL_GRACE_S``.

    torchrun starts each worker with ``start_new_session=True`` (torch's ``SubprocessHandler``),
    so signalling the child's own group would miss them; they are found through /proc before the
    first signal (once torchrun is gone they are no longer its descendants). A group is killed only
    while its leader is the very process seen then (same pid and start time). The build locks the
    tree held are removed afterwards if no live process holds them (``build_locks``).
    """
    from memfit.replay import build_locks

    tree = [proc.pid, *descendants(proc.pid)]
    locks = build_locks.held_build_locks(tree, build_locks.extension_roots(env))
    leaders = {proc.pid: start_time(proc.pid)}
    for pid in tree[1:]:
        try:
            pgid = os.getpgid(pid)
        except ProcessLookupError:
            continue
        leaders.setdefault(pgid, start_time(pgid))
    for pgid in leaders:
        _signal_group(pgid, signal.SIGTERM)
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + KILL_GRACE_S
    while any(start_time(g) == t for g, t in leaders.items() if g != proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pgid, started in leaders.items():
        same = proc.poll() is None if pgid == proc.pid else started is not None and start_time(pgid) == started
        if same:
            _signal_group(pgid, signal.SIGKILL)
    if locks:
        proc.wait()
        deadline = time.monotonic() + KILL_GRACE_S  # the SIGKILLed take a moment to close their files
        while any(alive(pid) for pid in tree) and time.monotonic() < deadline:
            time.sleep(0.05)
        build_locks.release_orphaned(locks)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
