"""Process helpers for the supervision tests: processes found by a marker in their environment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")


def new_marker() -> str:
    return f"memfit-test-{uuid.uuid4().hex}"


def marked(marker: str) -> list[int]:
    """Pids of live (non-zombie) processes whose environment carries ``MEMFIT_TEST_MARKER=marker``."""
    needle = f"MEMFIT_TEST_MARKER={marker}".encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                env = fh.read()
            with open(f"/proc/{name}/stat", "rb") as fh:
                state = fh.read().rpartition(b")")[2].split()[0]
        except OSError:
            continue
        if needle in env.split(b"\0") and state not in (b"Z", b"X"):
            out.append(int(name))
    return out


def describe(pids: list[int]) -> str:
    rows = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
            rows.append(f"{pid}: {cmd[:160]}")
        except OSError:
            rows.append(f"{pid}: (gone)")
    return "\n".join(rows)


def start_marked(code: str, marker: str, **kwargs) -> subprocess.Popen:
    """``python -c code`` with the marker and this checkout's src/ first on the path."""
    env = dict(os.environ, MEMFIT_TEST_MARKER=marker, PYTHONPATH=os.pathsep.join(
        [SRC, *filter(None, [os.environ.get("PYTHONPATH")])]))
    return subprocess.Popen([sys.executable, "-c", code], env=env, **kwargs)


def wait_until(predicate, timeout_s: float, poll_s: float = 0.05) -> float | None:
    """Seconds until ``predicate()`` held, or None when ``timeout_s`` ran out."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if predicate():
            return time.monotonic() - t0
        time.sleep(poll_s)
    return None


def kill_all(pids: list[int]) -> None:
    """Clean up after a failed test: SIGKILL what is left (only the marked processes it started)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
