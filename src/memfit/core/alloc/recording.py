"""A recorded allocator trace replayed through the simulator (BRIEF contract 4).

``check_against_recording(events, config)`` takes the ``device_traces`` of one device from
``torch.cuda.memory._snapshot()`` (as ``TraceEvent``s, or the snapshot's dicts) and replays the
requests it shows through ``CudaCachingAllocator``:
- an ``alloc`` is a ``malloc(size)`` (``size`` is the request, ``TraceEntry`` records ``orig_size``);
  the ``segment_*`` entries just before it are what that malloc did to get memory;
- ``free_requested`` directly followed by ``free_completed`` of the same address is a plain free; a
  ``free_requested`` completed later is a free deferred by ``recordStream`` events, and its later
  ``free_completed`` is the moment ``process_events`` saw them done;
- ``segment_free``/``segment_unmap`` entries not followed by an alloc or oom are an ``empty_cache()``;
- ``oom`` is a malloc that failed (``size`` is the rounded request, ``addr`` the free device memory).
cudaMalloc is given the address the recording saw (``segment_alloc``), so the best-fit choices, which
break ties by address, are the real ones. The card's capacity, when not given, is inferred at the
first ``oom``: the reserved bytes the recording shows there plus the free memory CUDA reported.

Every event where the simulated segments differ from the recorded ones (action, address, size; an
``alloc`` placed at another address) is a ``Divergence``. Limits: frees completed by the synchronize
inside malloc's retry are replayed before that malloc; a recording that starts with segments already
reserved (history enabled mid-run) reports frees of unknown blocks as divergences.
"""

from __future__ import annotations

from typing import Any, Iterable

from memfit.core.lean_dataclass import dataclass
from memfit.core.alloc.blocks import Block, TraceEvent
from memfit.core.alloc.conf import AllocConf
from memfit.core.alloc.device_caching import CudaCachingAllocator, OutOfMemory
from memfit.errors import MemfitError

SEGMENT_ACTIONS = ("segment_alloc", "segment_free", "segment_map", "segment_unmap")
ACTIONS = ("alloc", "free_requested", "free_completed", *SEGMENT_ACTIONS, "oom", "snapshot")


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordingConfig:
    conf: AllocConf = AllocConf()
    capacity_bytes: int | None = None
    """What cudaMalloc could get (None: inferred from an ``oom`` entry, else unlimited)."""
    device_total_bytes: int | None = None
    """The card's total memory (expandable address space, memory fraction)."""


@dataclass(frozen=True, slots=True)
class Divergence:
    index: int
    """Position of the recorded event in the input (-1: the simulator did something unrecorded)."""
    recorded: TraceEvent | None
    simulated: TraceEvent | None
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordingCheck:
    divergences: tuple[Divergence, ...]
    recorded_reserved_peak_bytes: int
    simulated_reserved_peak_bytes: int
    events_replayed: int
    capacity_bytes: int | None
    notes: tuple[str, ...] = ()

    @property
    def matches(self) -> bool:
        return not self.divergences and self.recorded_reserved_peak_bytes == self.simulated_reserved_peak_bytes


def _event(e: Any) -> TraceEvent:
    if isinstance(e, TraceEvent):
        ev = e
    elif isinstance(e, dict):
        action = e.get("action")
        addr = e.get("device_free", 0) if action == "oom" else e.get("addr", 0)
        ev = TraceEvent(str(action), int(addr or 0), int(e.get("size", 0) or 0), int(e.get("stream", 0) or 0))
    else:
        ev = TraceEvent(str(e.action), int(e.addr), int(e.size), int(getattr(e, "stream", 0) or 0))
    if ev.action not in ACTIONS:
        raise MemfitError(f"recording: unknown trace action {ev.action!r} (known: {', '.join(ACTIONS)})")
    return ev


def _recorded_reserved(events: list[tuple[int, TraceEvent]]) -> tuple[int, dict[int, int]]:
    cur = peak = 0
    at: dict[int, int] = {}
    for i, e in events:
        if e.action in ("segment_alloc", "segment_map"):
            cur += e.size
        elif e.action in ("segment_free", "segment_unmap"):
            cur -= e.size
        peak = max(peak, cur)
        at[i] = cur
    return peak, at


def check_against_recording(events: Iterable[Any], config: RecordingConfig | AllocConf | None = None) -> RecordingCheck:
    """Replay ``events`` (one device's ``device_traces``) and list every segment-layout divergence."""
    cfg = config if isinstance(config, RecordingConfig) else RecordingConfig(conf=config or AllocConf())
    evs = [(i, ev) for i, ev in enumerate(_event(e) for e in events) if ev.action != "snapshot"]
    rec_peak, reserved_at = _recorded_reserved(evs)
    notes: list[str] = []
    capacity = cfg.capacity_bytes
    if capacity is None:
        oom = next(((i, e) for i, e in evs if e.action == "oom"), None)
        if oom is not None:
            capacity = reserved_at[oom[0]] + oom[1].addr
            notes.append(f"capacity inferred at the first oom: {reserved_at[oom[0]]:,} B reserved + "
                         f"{oom[1].addr:,} B free = {capacity:,} B")
    sim = CudaCachingAllocator(cfg.conf, capacity_bytes=capacity, device_total_bytes=cfg.device_total_bytes,
                               record=True)
    r = _Replay(sim)
    pending: list[tuple[int, TraceEvent]] = []
    k = 0
    while k < len(evs):
        i, e = evs[k]
        if e.action in SEGMENT_ACTIONS:
            pending.append((i, e))
        elif e.action in ("alloc", "oom"):
            r.malloc(i, e, pending)
            pending = []
        elif e.action == "free_requested":
            if pending:
                r.empty_cache(pending)
                pending = []
            nxt = evs[k + 1][1] if k + 1 < len(evs) else None
            sync = nxt is not None and nxt.action == "free_completed" and nxt.addr == e.addr
            r.free(i, e, deferred=not sync)
            if sync:
                k += 1
        elif e.action == "free_completed":
            r.complete(i, e)
        k += 1
    if pending:
        r.empty_cache(pending)
    return RecordingCheck(divergences=tuple(r.div), recorded_reserved_peak_bytes=rec_peak,
                          simulated_reserved_peak_bytes=sim.stats.reserved_bytes.peak, events_replayed=len(evs),
                          capacity_bytes=capacity, notes=tuple(notes))


class _Replay:
    def __init__(self, sim: CudaCachingAllocator) -> None:
        self.sim = sim
        self.blocks: dict[int, Block] = {}
        self.div: list[Divergence] = []
        self.rec_base: dict[int, int] = {}
        """expandable segment (id) -> the recorded address of its start (from its first map)."""

    def _sim_events(self) -> list[TraceEvent]:
        out = [t for t in self.sim.trace if t.action in SEGMENT_ACTIONS]
        self.sim.trace.clear()
        return out

    def _translate(self, sim_ev: TraceEvent, rec_ev: TraceEvent | None) -> int:
        """The recorded address a simulated segment event corresponds to (expandable segments live at
        an address range the simulator cannot know; it is tied to the recording at their first map)."""
        for es in self.sim.expandables:
            if es.base <= sim_ev.addr < es.base + es.size:
                if id(es) not in self.rec_base and rec_ev is not None:
                    self.rec_base[id(es)] = rec_ev.addr - (sim_ev.addr - es.base)
                return self.rec_base.get(id(es), es.base) + (sim_ev.addr - es.base)
        return sim_ev.addr

    def _compare(self, recorded: list[tuple[int, TraceEvent]], what: str) -> None:
        simulated = self._sim_events()
        for n in range(max(len(recorded), len(simulated))):
            rec = recorded[n] if n < len(recorded) else None
            sim = simulated[n] if n < len(simulated) else None
            if sim is not None:
                sim = TraceEvent(sim.action, self._translate(sim, rec[1] if rec else None), sim.size, sim.stream)
            if rec is not None and sim is not None and (rec[1].action, rec[1].addr, rec[1].size) == (sim.action, sim.addr, sim.size):
                continue
            if rec is None:
                msg = f"{what}: the simulator did {sim.action} of {sim.size:,} B at {sim.addr:#x}, not in the recording"  # type: ignore[union-attr]
            elif sim is None:
                msg = f"{what}: the recording shows {rec[1].action} of {rec[1].size:,} B at {rec[1].addr:#x}; the simulator did not"
            else:
                msg = (f"{what}: recorded {rec[1].action} {rec[1].size:,} B at {rec[1].addr:#x}, "
                       f"simulated {sim.action} {sim.size:,} B at {sim.addr:#x}")
            self.div.append(Divergence(rec[0] if rec else -1, rec[1] if rec else None, sim, msg))

    def malloc(self, i: int, e: TraceEvent, segs: list[tuple[int, TraceEvent]]) -> None:
        sim = self.sim
        sim.forced_addresses = [s.addr for _, s in segs if s.action == "segment_alloc"]
        what = f"malloc({e.size:,}) at event {i}"
        try:
            b = sim.malloc(e.size, e.stream)
        except OutOfMemory:
            b = None
        sim.forced_addresses = []
        self._compare(segs, what)
        if e.action == "oom":
            sim.trace.clear()
            if b is not None:
                self.div.append(Divergence(i, e, None, f"{what}: the recording ran out of memory; the simulator did not"))
                sim.free(b)
                sim.trace.clear()
            return
        sim.trace.clear()
        if b is None:
            self.div.append(Divergence(i, e, None, f"{what}: the simulator ran out of memory; the recording did not"))
            return
        sim_addr = self._translate(TraceEvent("alloc", b.ptr, b.size, b.stream), None)
        if sim_addr != e.addr:
            self.div.append(Divergence(i, e, TraceEvent("alloc", sim_addr, e.size, e.stream),
                                       f"{what}: recorded at {e.addr:#x}, simulated at {sim_addr:#x}"))
        self.blocks[e.addr] = b

    def free(self, i: int, e: TraceEvent, *, deferred: bool) -> None:
        b = self.blocks.get(e.addr)
        if b is None:
            self.div.append(Divergence(i, e, None, f"free at event {i}: no recorded allocation at {e.addr:#x} "
                                                   "(history started mid-run?)"))
            return
        if not deferred:
            del self.blocks[e.addr]
        self.sim.free(b, deferred=deferred)
        self.sim.trace.clear()

    def complete(self, i: int, e: TraceEvent) -> None:
        b = self.blocks.pop(e.addr, None)
        if b is None or b.event_count == 0:
            self.div.append(Divergence(i, e, None, f"free_completed at event {i}: no deferred free at {e.addr:#x}"))
            return
        self.sim.complete(b)
        self.sim.trace.clear()

    def empty_cache(self, segs: list[tuple[int, TraceEvent]]) -> None:
        self.sim.empty_cache()
        self._compare(segs, f"empty_cache at event {segs[0][0]}")
