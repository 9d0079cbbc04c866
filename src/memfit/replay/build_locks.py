"""torch's JIT build locks, seen from outside a build: who holds one, and the locks a process memfit
stopped leaves behind.

A build lock is ``<build folder>/lock`` under torch's extensions root (``$TORCH_EXTENSIONS_DIR``,
else ``$XDG_CACHE_HOME/torch_extensions`` or ``~/.cache/torch_extensions``: torch 2.13,
``torch/utils/cpp_extension.py:get_default_build_root``), created with ``O_CREAT | O_EXCL`` and held
open by the builder until it removes it (``torch/utils/file_baton.py:FileBaton``). A builder killed
before its ``finally`` leaves the file, and every later build of that op waits on it forever.

memfit never removes a lock it merely finds (``memfit.replay.ops`` reports it, with the safe fix).
It removes one only when a process *it* started and then stopped held it, and no live process holds
it after that process is gone: then no build is running, and the lock is the stopped build's own
(``release_orphaned``). The watchdog of a replay process does the same for its own locks just before
it kills its process group (``release_own``).

Pure Python (``/proc``), no torch: the supervisor imports it.
"""

from __future__ import annotations

import os

LOCK_NAME = "lock"


def extension_roots(env: dict[str, str] | None = None) -> tuple[str, ...]:
    """Where torch may build extensions for a process with environment ``env`` (and this one's)."""
    roots = []
    for e in (env or {}, os.environ):
        if e.get("TORCH_EXTENSIONS_DIR"):
            roots.append(e["TORCH_EXTENSIONS_DIR"])
        cache = e.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        roots.append(os.path.join(cache, "torch_extensions"))
    return tuple(dict.fromkeys(os.path.realpath(r) for r in roots))


def is_build_lock(path: str, roots: tuple[str, ...]) -> bool:
    return os.path.basename(path) == LOCK_NAME and any(path.startswith(r + os.sep) for r in roots)


def open_paths(pid: int) -> list[str]:
    """The files process ``pid`` has open (``/proc/PID/fd``); empty when it is gone or hidden."""
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return []
    out = []
    for fd in fds:
        try:
            out.append(os.readlink(f"{fd_dir}/{fd}"))
        except OSError:
            continue
    return out


def held_build_locks(pids: list[int], roots: tuple[str, ...]) -> set[str]:
    """The build locks any of ``pids`` has open."""
    return {p for pid in pids for p in open_paths(pid) if is_build_lock(p, roots)}


def lock_holders(path: str) -> tuple[tuple[int, ...], bool]:
    """(pids with ``path`` open, whether every process could be inspected) through /proc/*/fd."""
    target = os.path.realpath(path)
    holders: list[int] = []
    complete = os.path.isdir("/proc/self/fd")
    try:
        pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return (), False
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except FileNotFoundError:
            continue  # exited meanwhile
        except PermissionError:
            complete = False
            continue
        for fd in fds:
            try:
                if os.readlink(f"{fd_dir}/{fd}") == target:
                    holders.append(pid)
                    break
            except OSError:
                continue
    return tuple(holders), complete


def release_orphaned(locks: set[str]) -> list[str]:
    """Remove each of ``locks`` (held by processes memfit stopped, all gone now) that still exists
    and that no live process holds; returns those removed."""
    removed = []
    for path in sorted(locks):
        if not os.path.exists(path):
            continue  # the build's own ``finally`` removed it
        holders, complete = lock_holders(path)
        if holders or not complete:
            continue  # someone else's build now, or we cannot tell: leave it
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def release_own() -> list[str]:
    """Remove the build locks this process holds (called just before it kills itself: its build
    dies with it)."""
    removed = []
    for path in held_build_locks([os.getpid()], extension_roots()):
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed
