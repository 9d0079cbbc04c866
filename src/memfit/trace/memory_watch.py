"""Stop a trace, in one line, before it takes the machine's last memory.

A fake-tensor trace holds no tensor data, but every op leaves Python and autograd objects (the
graph, the tracker's log), so its memory grows with the ops of the model (a 1,024-layer tiny llama
at 32 tokens peaked at 754 MB resident, the process's imports included; a layer with more ops, as a
mixture of experts, takes more). Rather than guess that from the config, the trace looks at what the machine has left
(``MemAvailable``, /proc/meminfo) every ``CHECK_EVERY`` modules of the forward and stops with a
``MemfitError`` below ``MIN_AVAILABLE_BYTES``: without it the kernel's OOM killer ends the process
on a signal, with no message.
"""

from __future__ import annotations

from memfit.errors import MemfitError

MIN_AVAILABLE_BYTES = 256 * 2**20
"""Memory the trace leaves to the rest of the machine (and to itself: freeing the graph, rendering)."""
CHECK_EVERY = 64
"""Modules between two looks (one read of /proc/meminfo, about 20 us)."""


def available_bytes() -> int | None:
    """``MemAvailable`` of /proc/meminfo, in bytes; None where there is none (not Linux)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class MemoryWatch:
    """Called once per traced module; every ``CHECK_EVERY`` calls, refuses to go on when less than
    ``MIN_AVAILABLE_BYTES`` is left."""

    def __init__(self, total_modules: int) -> None:
        self.total = total_modules
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        if self.calls % CHECK_EVERY:
            return
        left = available_bytes()
        if left is not None and left < MIN_AVAILABLE_BYTES:
            raise MemfitError(
                f"--exact stopped: this machine has {left / 2**20:,.0f} MiB of memory left after tracing "
                f"{self.calls:,} of the model's {self.total:,} modules (a trace keeps every op's autograd "
                f"objects; memfit leaves {MIN_AVAILABLE_BYTES // 2**20} MiB free): plan without --exact "
                "(the analytic activations), or where more memory is free")
