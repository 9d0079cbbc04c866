"""Replay a snapshot's device trace: live and reserved bytes at every event, per phase, per ledger key.

The trace may begin after the run did (``max_entries`` wraps the ring buffer; recording started
late), so the level before its first event is not zero in general. The snapshot's ``segments``
are the state at the moment of the dump, after the last event, and are exact: live bytes at the
end = the requested sizes of every block not ``inactive``; reserved at the end = every segment's
``total_size``. Walking the trace backwards from there gives the exact level before every event
(``live_before = live_after - delta``; ``alloc`` +size, ``free_completed`` -size, ``segment_alloc``
/``segment_map`` +size, ``segment_free``/``segment_unmap`` -size; ``free_requested`` changes
nothing: the block stays in use until its streams are done). Allocations made before the trace
began have no frames: they are counted as ``before trace``.
"""

from __future__ import annotations

import bisect
from dataclasses import field

from memfit.core.lean_dataclass import dataclass
from memfit.core.compare.frames import FrameReader
from memfit.core.records.types import ALLOCATOR_ACTIONS, MemorySnapshot, StackFrame, TraceEvent

BEFORE = ("(before trace)",)
UNKNOWN = ()
"""Keys of an allocation no rule matched."""


def allocator_events(snapshot: MemorySnapshot, device: int = 0) -> tuple[TraceEvent, ...]:
    """The sequence BRIEF contract 4 hands to the allocator simulator: the device's trace entries whose
    action the allocator performs (``snapshot`` marks are dropped), in recorded order."""
    trace = snapshot.trace(device)
    if trace is None:
        return ()
    return tuple(e for e in trace.events if e.action in ALLOCATOR_ACTIONS)


def end_state(snapshot: MemorySnapshot, device: int) -> tuple[int, int]:
    """(live requested bytes, reserved bytes) at the dump, from the segments."""
    live = reserved = 0
    for seg in snapshot.segments:
        if seg.device != device:
            continue
        reserved += seg.total_size
        live += sum(b.requested_size for b in seg.blocks if b.live)
    return live, reserved


@dataclass
class _Live:
    size: int
    keys: tuple[str, ...]
    site: str
    frames: tuple[StackFrame, ...]


@dataclass
class TraceReplay:
    """Levels after every event, and the attribution state needed at chosen instants."""

    events: tuple[TraceEvent, ...]
    live: list[int] = field(default_factory=list)
    """Live requested bytes after each event."""
    reserved: list[int] = field(default_factory=list)
    live_start: int = 0
    reserved_start: int = 0
    consistent: bool = True
    notes: list[str] = field(default_factory=list)


def replay_levels(snapshot: MemorySnapshot, device: int = 0) -> TraceReplay:
    events = allocator_events(snapshot, device)
    live_end, reserved_end = end_state(snapshot, device)
    r = TraceReplay(events=events)
    n = len(events)
    live = [0] * n
    reserved = [0] * n
    lv, rv = live_end, reserved_end
    for i in range(n - 1, -1, -1):
        live[i], reserved[i] = lv, rv
        e = events[i]
        if e.action == "alloc":
            lv -= e.size
        elif e.action == "free_completed":
            lv += e.size
        elif e.action in ("segment_alloc", "segment_map"):
            rv -= e.size
        elif e.action in ("segment_free", "segment_unmap"):
            rv += e.size
    r.live, r.reserved, r.live_start, r.reserved_start = live, reserved, lv, rv
    if lv < 0 or rv < 0 or any(x < 0 for x in live) or any(x < 0 for x in reserved):
        r.consistent = False
        r.notes.append(f"device {device}: the trace and the snapshot's segments disagree (a level would go negative): "
                       "events are missing (private pools, another allocator); trace figures are not shown")
    elif lv or rv:
        r.notes.append(f"device {device}: the trace begins with {lv:,} B live and {rv:,} B reserved already "
                       "(recording started late or its max_entries ring buffer wrapped); levels are exact "
                       "(reconstructed backwards from the snapshot), attribution of those bytes is not")
    return r


def window_indices(events: tuple[TraceEvent, ...], t0_us: int, t1_us: int) -> tuple[int, int]:
    """Event index range [i, j) with t0 <= time_us < t1 (events without time_us are never in a window)."""
    times = [e.time_us if e.time_us is not None else -1 for e in events]
    return bisect.bisect_left(times, t0_us), bisect.bisect_left(times, t1_us)


def peak_in(r: TraceReplay, i: int, j: int) -> tuple[int, int | None, int]:
    """(peak live bytes, index of the event that reached it or None for the level at entry, peak reserved)."""
    level_in = r.live[i - 1] if i > 0 else r.live_start
    res_in = r.reserved[i - 1] if i > 0 else r.reserved_start
    best, at, res = level_in, None, res_in
    for k in range(i, j):
        if r.live[k] > best:
            best, at = r.live[k], k
        res = max(res, r.reserved[k])
    return best, at, res


class KeyedReplay:
    """Forward pass that knows, at any event, which allocations are live and their ledger keys."""

    def __init__(self, replay: TraceReplay, reader: FrameReader) -> None:
        self.r = replay
        self.reader = reader

    def run(self, stops: set[int]) -> tuple[dict[int, dict[tuple[str, ...], int]], dict[str, dict]]:
        """Live bytes per key group after each event index in ``stops`` (-1 = before the first event),
        and, per allocation site, its peak live bytes, count, keys, a sample stack and the indices of
        its allocations."""
        live: dict[int, _Live] = {}
        before = self.r.live_start
        by_stop: dict[int, dict[tuple[str, ...], int]] = {}
        sites: dict[str, dict] = {}
        site_live: dict[str, int] = {}

        def totals() -> dict[tuple[str, ...], int]:
            out: dict[tuple[str, ...], int] = {}
            if before:
                out[BEFORE] = before
            for a in live.values():
                out[a.keys] = out.get(a.keys, 0) + a.size
            return out

        if -1 in stops:
            by_stop[-1] = totals()
        for k, e in enumerate(self.r.events):
            if e.action == "alloc":
                keys = self.reader.keys_for(e.frames)
                site = self.reader.where(e.frames)
                live[e.addr] = _Live(e.size, keys if keys is not None else UNKNOWN, site, e.frames)
                s = sites.setdefault(site, {"keys": keys, "count": 0, "peak": 0, "frames": e.frames, "allocs": []})
                s["count"] += 1
                s["allocs"].append(k)
                site_live[site] = site_live.get(site, 0) + e.size
                s["peak"] = max(s["peak"], site_live[site])
            elif e.action == "free_completed":
                a = live.pop(e.addr, None)
                if a is None:
                    before = max(0, before - e.size)
                else:
                    site_live[a.site] -= a.size
            if k in stops:
                by_stop[k] = totals()
        return by_stop, sites
