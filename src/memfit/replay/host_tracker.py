"""Byte-exact tensor memory over time, from the allocators' own reports (torch.profiler).

With ``profile_memory=True`` the profiler receives every allocation and free that torch's
allocators report through ``c10::reportMemoryUsageToProfiler``: the CPU allocator
(``c10/core/CPUAllocator.cpp``, ``ProfiledCPUMemoryReporter``: requested bytes, no rounding, also
for tensors that C++ extensions such as DeepSpeed's cpu_adam create through ATen) and the CUDA
caching allocator (``c10/cuda/CUDACachingAllocator.cpp``: block sizes, rounded to 512 B). Each
report carries the pointer and a signed size; summing them in time order gives the live bytes at
every instant. Phase boundaries are zero-length ``record_function`` events in the same clock, and
DeepSpeed's ``pin_memory`` calls are recorded the same way with the storage pointer, so every
allocation can be classed pinned or pageable after the fact.

Only allocations made after ``start()`` count ("live" = allocated since the tracker started and not
yet freed); frees of older storages are ignored (the CPU reporter does not even report them).

``summarize`` is pure (plain events in, numbers out) so it is tested on synthetic events; the
``HostTracker`` part needs torch.
"""

from __future__ import annotations

from dataclasses import dataclass

MARK_PREFIX = "memfit.mark:"
PIN_PREFIX = "memfit.pin:"


@dataclass(frozen=True, slots=True)
class AllocEvent:
    """One allocator report: ``delta_bytes`` > 0 allocates at ``ptr``, < 0 frees it."""

    t_ns: int
    ptr: int
    delta_bytes: int
    device: str
    """``cpu`` (host, pinned or not) or ``cuda``."""
    total_bytes: int | None = None
    """The allocator's running total after this report (``total_allocated``): orders reports that
    share a timestamp."""


@dataclass(frozen=True, slots=True)
class Mark:
    """Start of window ``index`` (phase boundaries)."""

    t_ns: int
    index: int


@dataclass(frozen=True, slots=True)
class PinEvent:
    """DeepSpeed pinned (or, on the CPU accelerator, would have pinned) the storage at ``ptr``."""

    t_ns: int
    ptr: int


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowStats:
    """Live bytes over one window (between two marks)."""

    index: int
    host_live_start_bytes: int
    host_live_end_bytes: int
    host_peak_bytes: int
    host_peak_pinned_bytes: int
    host_peak_pageable_bytes: int
    host_pinned_end_bytes: int
    host_max_pinned_bytes: int
    device_live_start_bytes: int
    device_live_end_bytes: int
    device_peak_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    """Live bytes right after one allocator report (for the timeline)."""

    t_ns: int
    window: int
    host_live_bytes: int
    host_pinned_bytes: int
    device_live_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TrackerResult:
    windows: tuple[WindowStats, ...]
    samples: tuple[Sample, ...]
    unmatched_pins: int
    """Pin events whose pointer matched no tracked allocation (e.g. memory from an allocator that
    does not report to the profiler); their bytes are not in the pinned totals."""
    events: int


def summarize(
    events: list[AllocEvent], marks: list[Mark], pins: list[PinEvent], *, num_windows: int
) -> TrackerResult:
    """Live bytes per window from allocator reports, phase marks and pin events.

    Two passes. The first replays allocations and frees in time order, keeping ``ptr -> allocation
    id`` for the live ones, and resolves each pin event to the allocation live at its pointer at that
    time: that allocation is pinned for its whole life (DeepSpeed pins right after allocating, or
    copies into a freshly pinned block). The second pass sums, per device and class, and records
    each window's start, end and peak. A window with no events keeps the live value it started with.
    Events at the same nanosecond as a mark belong to the window the mark opens.
    """
    timeline: list[tuple[int, int, int, object]] = []
    for m in marks:
        timeline.append((m.t_ns, 0, 0, m))
    for i, e in enumerate(events):
        timeline.append((e.t_ns, 1, i, e))
    for i, p in enumerate(pins):
        timeline.append((p.t_ns, 2, i, p))
    timeline.sort(key=lambda x: (x[0], x[1], x[2]))

    # Pass 1: allocation identity and pinned allocations.
    live_id: dict[tuple[str, int], int] = {}
    alloc_of_event: dict[int, int] = {}
    pinned_allocs: set[int] = set()
    unmatched = 0
    next_id = 0
    for _, kind, idx, item in timeline:
        if kind == 1:
            e = item  # type: ignore[assignment]
            key = (e.device, e.ptr)
            if e.delta_bytes > 0:
                live_id[key] = next_id
                alloc_of_event[idx] = next_id
                next_id += 1
            else:
                aid = live_id.pop(key, None)
                if aid is not None:
                    alloc_of_event[idx] = aid
        elif kind == 2:
            aid = live_id.get(("cpu", item.ptr))  # type: ignore[union-attr]
            if aid is None:
                unmatched += 1
            else:
                pinned_allocs.add(aid)

    # Pass 2: sums.
    host = pinned = device = 0
    windows: list[dict[str, int] | None] = [None] * num_windows
    samples: list[Sample] = []
    current = -1

    def open_window(index: int) -> None:
        windows[index] = {
            "host_live_start_bytes": host, "host_peak_bytes": host, "host_peak_pinned_bytes": pinned,
            "host_peak_pageable_bytes": host - pinned, "host_max_pinned_bytes": pinned,
            "device_live_start_bytes": device, "device_peak_bytes": device,
        }

    def close_window(index: int) -> None:
        w = windows[index]
        if w is not None:
            w.update(host_live_end_bytes=host, host_pinned_end_bytes=pinned, device_live_end_bytes=device)

    for t_ns, kind, idx, item in timeline:
        if kind == 0:
            if current >= 0:
                close_window(current)
            current = item.index  # type: ignore[union-attr]
            open_window(current)
            continue
        if kind != 1:
            continue
        aid = alloc_of_event.get(idx)
        if aid is None:
            continue  # free of a storage allocated before the tracker started
        e = item  # type: ignore[assignment]
        if e.device == "cpu":
            host += e.delta_bytes
            if aid in pinned_allocs:
                pinned += e.delta_bytes
        else:
            device += e.delta_bytes
        if current >= 0:
            w = windows[current]
            if host > w["host_peak_bytes"]:
                w.update(host_peak_bytes=host, host_peak_pinned_bytes=pinned, host_peak_pageable_bytes=host - pinned)
            w["host_max_pinned_bytes"] = max(w["host_max_pinned_bytes"], pinned)
            w["device_peak_bytes"] = max(w["device_peak_bytes"], device)
        samples.append(Sample(t_ns=t_ns, window=current, host_live_bytes=host, host_pinned_bytes=pinned,
                              device_live_bytes=device))
    if current >= 0:
        close_window(current)

    out = []
    for index, w in enumerate(windows):
        if w is None:  # never opened (the run stopped before this phase)
            continue
        out.append(WindowStats(index=index, **w))
    return TrackerResult(windows=tuple(out), samples=tuple(samples), unmatched_pins=unmatched, events=len(events))


def alloc_sequence(events: list[AllocEvent], marks: list[Mark], pins: list[PinEvent],
                   windows: list[tuple[str, int]], *, device: str = "cpu"):
    """The tensors ``device``'s allocator reported over consecutive ``windows`` ((label, window index),
    in order) as a ``core.alloc.sequence.AllocSequence``: the tensors live when the first window opens
    (allocated since the tracker started, in allocation order), then every allocation and free until
    the last window closes (the next mark, or the end). Pins resolve to the allocation live at their
    pointer, as in ``summarize``. Pure (plain events in)."""
    from memfit.core.alloc.sequence import AllocSequence

    mark_t = {m.index: m.t_ns for m in marks}
    begin = mark_t[windows[0][1]]
    last = windows[-1][1]
    end = min((m.t_ns for m in marks if m.index > last), default=None)
    mine = chain_order([e for e in events if e.device == device])
    timeline: list[tuple[int, int, int, object]] = [(e.t_ns, 1, i, e) for i, e in enumerate(mine)]
    timeline += [(p.t_ns, 2, i, p) for i, p in enumerate(pins)]
    timeline += [(mark_t[w], 0, k, label) for k, (label, w) in enumerate(windows)]
    timeline.sort(key=lambda x: (x[0], x[1], x[2]))
    ptr_id: dict[int, int] = {}
    sizes: list[int] = []
    alive: dict[int, None] = {}
    pinned: set[int] = set()
    ops: list[int] | None = None
    remap: dict[int, int] = {}
    live: tuple[int, ...] = ()
    out_marks: list[tuple[str, int]] = []
    for t_ns, kind, _, item in timeline:
        if end is not None and t_ns >= end:
            break
        if ops is None and t_ns >= begin:
            ids = list(alive)
            remap = {t: j for j, t in enumerate(ids)}
            live = tuple(sizes[t] for t in ids)
            ops = []
        if kind == 0:
            out_marks.append((str(item), len(ops or ())))
        elif kind == 1:
            e = item  # type: ignore[assignment]
            if e.delta_bytes > 0:
                tid = len(sizes)
                sizes.append(e.delta_bytes)
                ptr_id[e.ptr] = tid
                alive[tid] = None
                if ops is not None:
                    remap[tid] = len(live) + sum(1 for n in ops if n > 0)
                    ops.append(e.delta_bytes)
            else:
                tid = ptr_id.pop(e.ptr, None)
                if tid is None:
                    continue  # allocated before the tracker started
                del alive[tid]
                if ops is not None and tid in remap:
                    ops.append(~remap[tid])
        else:
            tid = ptr_id.get(item.ptr)  # type: ignore[union-attr]
            if tid is not None:
                pinned.add(tid)
    ops = ops or []
    return AllocSequence(live=live, ops=tuple(ops), marks=tuple(out_marks),
                         pinned=tuple(sorted(remap[t] for t in pinned if t in remap)),
                         source=f"torch.profiler profile_memory=True, {device} allocator reports")


def chain_order(events: list[AllocEvent]) -> list[AllocEvent]:
    """``events`` of one allocator in time order; reports with the same timestamp in the order their
    running totals (``total_bytes``) chain: each one's total is the previous total plus its delta."""
    evs = sorted(events, key=lambda e: e.t_ns)
    out: list[AllocEvent] = []
    k = 0
    total = None
    while k < len(evs):
        j = k
        while j < len(evs) and evs[j].t_ns == evs[k].t_ns:
            j += 1
        group = evs[k:j]
        while group:
            pick = 0
            if total is not None and len(group) > 1:
                pick = next((g for g, e in enumerate(group) if e.total_bytes == total + e.delta_bytes), 0)
            e = group.pop(pick)
            out.append(e)
            total = e.total_bytes
        k = j
    return out


def downsample(samples: tuple[Sample, ...], max_points: int) -> tuple[Sample, ...]:
    """At most about ``max_points`` samples, keeping each window's first and last sample and, per
    chunk, the highest host and device samples (so every peak survives)."""
    if len(samples) <= max_points:
        return samples
    keep: set[int] = set()
    first_of: dict[int, int] = {}
    for i, s in enumerate(samples):
        first_of.setdefault(s.window, i)
        if i + 1 == len(samples) or samples[i + 1].window != s.window:
            keep.add(i)
    keep.update(first_of.values())
    chunks = max(1, max_points // 2)
    size = -(-len(samples) // chunks)
    for start in range(0, len(samples), size):
        chunk = range(start, min(start + size, len(samples)))
        keep.add(max(chunk, key=lambda i: samples[i].host_live_bytes))
        keep.add(max(chunk, key=lambda i: samples[i].device_live_bytes))
    return tuple(samples[i] for i in sorted(keep))


class HostTracker:
    """torch.profiler with ``profile_memory=True`` over the whole child, plus marks and pin events.

    Usage: ``start()``, ``mark()`` at each phase start (returns the window index), ``note_pinned``
    for tensors DeepSpeed pins, ``stop()`` -> ``TrackerResult``.
    """

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self._prof = None
        self._marks = 0
        self.raw: tuple[list[AllocEvent], list[Mark], list[PinEvent]] | None = None
        """(allocation reports, marks, pin events) once stopped (``alloc_sequence`` reads them)."""

    def start(self) -> None:
        if not self.enabled:
            return
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False,
                             with_stack=False)
        self._prof.__enter__()

    def mark(self) -> int:
        """Open the next window; returns its index."""
        index = self._marks
        self._marks += 1
        if self._prof is not None:
            from torch.profiler import record_function

            with record_function(f"{MARK_PREFIX}{index}"):
                pass
        return index

    def note_pinned(self, tensor) -> None:
        if self._prof is None:
            return
        from torch.profiler import record_function

        try:
            ptr = tensor.untyped_storage().data_ptr()
        except (RuntimeError, AttributeError):
            return
        with record_function(f"{PIN_PREFIX}{ptr}"):
            pass

    def stop(self) -> TrackerResult | None:
        if self._prof is None:
            return None
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        events, marks, pins = extract_events(prof)
        self.raw = (events, marks, pins)
        return summarize(events, marks, pins, num_windows=self._marks)


def extract_events(prof) -> tuple[list[AllocEvent], list[Mark], list[PinEvent]]:
    """Allocation reports, marks and pin events from a finished ``torch.profiler.profile``.

    Reads the profiler's event tree (``kineto_results.experimental_event_tree()``, the structure
    ``torch.profiler._memory_profiler`` reads): ``Allocation`` events carry ``ptr``,
    ``alloc_size`` (signed) and ``device``.
    """
    from torch._C._profiler import _EventType

    events: list[AllocEvent] = []
    marks: list[Mark] = []
    pins: list[PinEvent] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        ev = stack.pop()
        stack.extend(ev.children)
        if ev.tag == _EventType.Allocation:
            ef = ev.extra_fields
            dev = "cpu" if ef.device.type == "cpu" else "cuda" if ef.device.type == "cuda" else None
            if dev is None:
                continue
            events.append(AllocEvent(t_ns=ev.start_time_ns, ptr=int(ef.ptr), delta_bytes=int(ef.alloc_size), device=dev,
                                     total_bytes=int(ef.total_allocated)))
        else:
            name = ev.name
            if name.startswith(MARK_PREFIX):
                marks.append(Mark(t_ns=ev.start_time_ns, index=int(name[len(MARK_PREFIX):])))
            elif name.startswith(PIN_PREFIX):
                pins.append(PinEvent(t_ns=ev.start_time_ns, ptr=int(name[len(PIN_PREFIX):])))
    return events, marks, pins

