"""Phase boundaries in the replay child, and the live readings taken at each boundary.

``PhaseRecorder.enter(name)`` closes the running phase and opens ``name``: it marks the host
tracker's timeline, resets the peak counters (VmHWM through ``/proc/self/clear_refs``; CUDA peaks
through ``torch.cuda.reset_peak_memory_stats``), and appends one JSON line to the progress file so
the parent knows the phase even if the child is killed. ``finish`` merges the tracker's per-window
numbers into ``PhaseMeasurement`` rows.

Phase names are ``memfit.core.ledger_types.PHASES``; the seams inside ``deepspeed.initialize`` are
in ``memfit.replay.deepspeed.seams``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field, replace

from memfit.core.ledger_types import ALL_PHASES
from memfit.replay.host_tracker import HostTracker, TrackerResult
from memfit.replay.measurement import PhaseMeasurement


def _proc_status_bytes(*keys: str) -> dict[str, int]:
    out = {}
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                name, _, rest = line.partition(":")
                if name in keys:
                    out[name] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


class RssMonitor:
    """Peak resident set size since the last ``reset``.

    Linux: writing ``5`` to ``/proc/self/clear_refs`` resets VmHWM to the current RSS (see
    proc(5)), so the peak is exact. Where that is refused, a thread samples VmRSS every 2 ms.
    """

    def __init__(self) -> None:
        self._exact = self._try_reset()
        self._peak = 0
        self._stop = threading.Event()
        self._thread = None
        if not self._exact:
            self._thread = threading.Thread(target=self._poll, name="memfit-rss", daemon=True)
            self._thread.start()

    @staticmethod
    def _try_reset() -> bool:
        try:
            with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
                fh.write("5")
            return True
        except OSError:
            return False

    def _poll(self) -> None:
        while not self._stop.wait(0.002):
            self._peak = max(self._peak, self.current())

    @property
    def exact(self) -> bool:
        return self._exact

    def current(self) -> int | None:
        return _proc_status_bytes("VmRSS").get("VmRSS")

    def reset(self) -> None:
        if self._exact:
            self._try_reset()
        else:
            self._peak = self.current() or 0

    def peak(self) -> int | None:
        if self._exact:
            return _proc_status_bytes("VmHWM").get("VmHWM")
        return max(self._peak, self.current() or 0)

    def close(self) -> None:
        self._stop.set()


class CudaStats:
    """Device counters for one phase (``torch.cuda``), taken after a synchronize."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.has_host_stats = hasattr(torch.cuda, "host_memory_stats")

    def start(self) -> dict[str, int]:
        cuda = self.torch.cuda
        cuda.synchronize()
        stats = cuda.memory_stats()
        out = {
            "allocated": cuda.memory_allocated(),
            "num_ooms": int(stats.get("num_ooms", 0)),
            "num_alloc_retries": int(stats.get("num_alloc_retries", 0)),
        }
        cuda.reset_peak_memory_stats()
        if self.has_host_stats:
            try:
                cuda.reset_peak_host_memory_stats()
            except (RuntimeError, AttributeError):
                self.has_host_stats = False
        return out

    def end(self, start: dict[str, int]) -> dict[str, int | None]:
        cuda = self.torch.cuda
        try:
            cuda.synchronize()
        except RuntimeError:
            pass  # a device fault: report what the allocator still knows
        stats = cuda.memory_stats()
        host_peak = host_end = None
        if self.has_host_stats:
            # allocated_bytes: pinned blocks held (in use + cached) at their rounded size, what is page-locked
            # (CachingHostAllocator.h getStats); active_bytes leaves the cache out and its peak is a per-bucket sum
            host = cuda.host_memory_stats()
            for key in ("allocated_bytes.peak", "allocated_bytes.all.peak"):
                if key in host:
                    host_peak = int(host[key])
                    break
            for key in ("allocated_bytes.current", "allocated_bytes.all.current"):
                if key in host:
                    host_end = int(host[key])
                    break
        free, total = cuda.mem_get_info()
        return {
            "device_driver_used_end_bytes": int(total - free),
            "device_allocated_start_bytes": start["allocated"],
            "device_allocated_end_bytes": cuda.memory_allocated(),
            "device_peak_allocated_bytes": cuda.max_memory_allocated(),
            "device_peak_reserved_bytes": cuda.max_memory_reserved(),
            "device_reserved_end_bytes": cuda.memory_reserved(),
            "device_num_ooms": int(stats.get("num_ooms", 0)) - start["num_ooms"],
            "device_num_alloc_retries": int(stats.get("num_alloc_retries", 0)) - start["num_alloc_retries"],
            "cuda_host_peak_bytes": host_peak,
            "cuda_host_end_bytes": host_end,
        }


@dataclass
class _Open:
    name: str
    step: int | None
    micro_step: int | None
    window: int
    start_s: float
    rss_start: int | None
    cuda_start: dict[str, int] | None


@dataclass
class PhaseRecorder:
    """Opens and closes phases; one instance per child run."""

    tracker: HostTracker
    cuda: CudaStats | None
    progress_path: str | None
    t0: float = field(default_factory=time.perf_counter)
    rss: RssMonitor = field(default_factory=RssMonitor)
    closed: list[tuple[int, PhaseMeasurement]] = field(default_factory=list)
    current: _Open | None = None
    hooks: list = field(default_factory=list)
    """Callables ``hook(name)`` run right after a phase opens (fault injection)."""

    @property
    def current_phase(self) -> str | None:
        return self.current.name if self.current else None

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def enter(self, name: str, *, step: int | None = None, micro_step: int | None = None) -> None:
        if name not in ALL_PHASES:
            raise ValueError(f"unknown phase {name!r}")
        self.close(completed=True)
        window = self.tracker.mark()
        rss_start = self.rss.current()
        self.rss.reset()
        cuda_start = self.cuda.start() if self.cuda else None
        self.current = _Open(name, step, micro_step, window, self.now(), rss_start, cuda_start)
        self._progress({"event": "enter", "phase": name, "step": step, "micro_step": micro_step,
                        "t_s": self.current.start_s})
        for hook in self.hooks:
            hook(name)

    def close(self, *, completed: bool = True) -> None:
        cur, self.current = self.current, None
        if cur is None:
            return
        values: dict = {}
        if self.cuda and cur.cuda_start is not None:
            values.update(self.cuda.end(cur.cuda_start))
        row = PhaseMeasurement(
            name=cur.name, step=cur.step, micro_step=cur.micro_step, start_s=cur.start_s, end_s=self.now(),
            completed=completed, rss_start_bytes=cur.rss_start, rss_end_bytes=self.rss.current(),
            rss_peak_bytes=self.rss.peak(), **values,
        )
        self.closed.append((cur.window, row))
        self._progress({"event": "close", "row": _row_dict(row)})

    def finish(self, result: TrackerResult | None) -> tuple[PhaseMeasurement, ...]:
        """Every closed phase, with the tracker's host numbers merged in."""
        self.rss.close()
        by_window = {w.index: w for w in result.windows} if result else {}
        rows = []
        for window, row in self.closed:
            w = by_window.get(window)
            if w is not None:
                row = replace(
                    row,
                    host_live_start_bytes=w.host_live_start_bytes, host_live_end_bytes=w.host_live_end_bytes,
                    host_peak_bytes=w.host_peak_bytes, host_peak_pinned_bytes=w.host_peak_pinned_bytes,
                    host_peak_pageable_bytes=w.host_peak_pageable_bytes,
                    host_pinned_end_bytes=w.host_pinned_end_bytes, host_max_pinned_bytes=w.host_max_pinned_bytes,
                )
            rows.append(row)
        return tuple(rows)

    def window_names(self) -> dict[int, str]:
        names = {window: row.name for window, row in self.closed}
        if self.current is not None:
            names[self.current.window] = self.current.name
        return names

    def _progress(self, record: dict) -> None:
        if not self.progress_path:
            return
        with open(self.progress_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def _row_dict(row: PhaseMeasurement) -> dict:
    return {k: getattr(row, k) for k in row.__dataclass_fields__}


def read_progress(path: str) -> tuple[str | None, tuple[PhaseMeasurement, ...]]:
    """The phase a child was in and the phases it closed, from its progress file (parent side)."""
    current = None
    rows = []
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None, ()
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
        if record.get("event") == "enter":
            current = record["phase"]
        elif record.get("event") == "close":
            rows.append(PhaseMeasurement(**record["row"]))
            current = None
    return current, tuple(rows)
