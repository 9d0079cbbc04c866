"""Tensor-by-tensor alloc/free sequences: the ledger's against a recorded run's, and both through the
CUDA caching allocator.

An ``AllocSequence`` is what an allocator sees over a window of a run (a training step): the tensors
live when the window opens (``live``, their sizes in the order they were allocated: ids 0..n-1),
then ``ops`` in order: ``n > 0`` allocates a tensor of n bytes (the next id), ``n < 0`` frees tensor
``~n`` (``-n - 1``). ``marks`` name where each phase of the window begins (an index into ``ops``).

Two sources, one format:
- a replay (``memfit.replay.host_tracker.alloc_sequence``): every allocation and free the process's
  CPU allocator reported to torch.profiler (``profile_memory=True``), with their exact requested
  sizes, between the first forward and the end of the last optimizer step;
- the ledger (``from_timeline``): ``Timeline.events`` over the same phases, each ``alloc`` call one
  tensor, a ``free(key, n)`` the most recent live tensor of n bytes of that key (``free(key)``: all of
  them), as ``Timeline`` itself resolves them; ``keys`` names each tensor's ledger line.

``align`` matches the two tensor by tensor: per phase, in order, each ledger tensor with the first
recorded tensor of the same size not yet matched after the previous match. ``simulate`` feeds a
sequence through ``CudaCachingAllocator`` (the live tensors first, in order, then the ops; one
stream, no capacity limit) and reports each phase's allocated, reserved and OOM-relevant peaks, the
figures a CUDA plan takes from the simulator.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import field

from memfit.core.lean_dataclass import dataclass
from memfit.core.alloc.conf import AllocConf
from memfit.core.alloc.device_caching import CudaCachingAllocator


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocSequence:
    live: tuple[int, ...]
    """Sizes of the tensors live when the window opens, in allocation order (ids 0..len-1)."""
    ops: tuple[int, ...]
    """``n > 0``: allocate n bytes (next id); ``n < 0``: free tensor ``~n``."""
    marks: tuple[tuple[str, int], ...]
    """(phase, index into ``ops`` where it begins), in order."""
    pinned: tuple[int, ...] = ()
    """Ids of tensors DeepSpeed passed through ``pin_memory`` (recorded sequences)."""
    keys: tuple[str, ...] = ()
    """Ledger sequences: the ledger line of each id."""
    source: str = ""

    def to_dict(self) -> dict:
        return {"live": " ".join(map(str, self.live)), "ops": " ".join(map(str, self.ops)),
                "marks": [list(m) for m in self.marks], "pinned": list(self.pinned), "source": self.source}

    @classmethod
    def from_dict(cls, d: dict) -> AllocSequence:
        def ints(s: str) -> tuple[int, ...]:
            return tuple(int(x) for x in s.split())

        return cls(live=ints(d.get("live", "")), ops=ints(d.get("ops", "")),
                   marks=tuple((str(n), int(i)) for n, i in d.get("marks", ())),
                   pinned=tuple(int(x) for x in d.get("pinned", ())), source=str(d.get("source", "")))

    @property
    def sizes(self) -> list[int]:
        """Every id's size: the live tensors', then each allocation's."""
        return [*self.live, *(n for n in self.ops if n > 0)]

    def phase_range(self, phase: str) -> tuple[int, int]:
        names = [n for n, _ in self.marks]
        k = names.index(phase)
        end = self.marks[k + 1][1] if k + 1 < len(self.marks) else len(self.ops)
        return self.marks[k][1], end

    def allocations(self, phase: str) -> list[tuple[int, int]]:
        """(id, bytes) of the tensors allocated during ``phase``, in order."""
        start, end = self.phase_range(phase)
        next_id = len(self.live) + sum(1 for n in self.ops[:start] if n > 0)
        out = []
        for n in self.ops[start:end]:
            if n > 0:
                out.append((next_id, n))
                next_id += 1
        return out


class _Tensors:
    """``Timeline``'s tensor identities replayed from its events (``Timeline.free``/``_untrack``)."""

    def __init__(self) -> None:
        self.by_key: dict[str, list[list[int]]] = {}
        self.sizes: list[int] = []
        self.keys: list[str] = []
        self.alive: dict[int, None] = {}
        self.ops: list[int] | None = None

    def alloc(self, key: str, n: int) -> None:
        tid = len(self.sizes)
        self.sizes.append(n)
        self.keys.append(key)
        self.alive[tid] = None
        self.by_key.setdefault(key, []).append([n, tid])
        if self.ops is not None:
            self.ops.append(n)

    def _drop(self, tid: int) -> None:
        del self.alive[tid]
        if self.ops is not None:
            self.ops.append(~tid)

    def free(self, key: str, n: int) -> None:
        ts = self.by_key.get(key, [])
        if n == sum(x[0] for x in ts):
            for x in reversed(ts):
                self._drop(x[1])
            ts.clear()
            return
        for j in range(len(ts) - 1, -1, -1):
            if ts[j][0] == n:
                self._drop(ts.pop(j)[1])
                return
        remaining = n
        while remaining > 0:
            m, tid = ts.pop()
            self._drop(tid)
            if m > remaining:
                self.alloc(key, m - remaining)
                remaining = 0
            else:
                remaining -= m

    def restart(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """Renumber the live tensors 0..n-1 (allocation order) and start recording ops."""
        ids = list(self.alive)
        remap = {t: j for j, t in enumerate(ids)}
        self.sizes = [self.sizes[t] for t in ids]
        self.keys = [self.keys[t] for t in ids]
        self.alive = dict.fromkeys(range(len(ids)))
        self.by_key = {k: [[n, remap[t]] for n, t in ts] for k, ts in self.by_key.items()}
        self.ops = []
        return tuple(self.sizes), tuple(self.keys)


def from_timeline(events: Sequence[tuple[str, str, object, int]], phase_starts: Sequence[tuple[str, int]],
                  phases: Sequence[str], *, include: Callable[[str, object], bool] | None = None) -> AllocSequence:
    """The ledger's tensors over ``phases`` (consecutive ledger phases) as an ``AllocSequence``.

    ``events`` and ``phase_starts`` are a ``Timeline``'s; ``include(key, device)`` selects the events
    (default: all of them). A ``free`` resolves as ``Timeline`` does: all the key's tensors when it
    frees everything live, else the most recent live tensor of exactly that size, else (a partial free
    of a lump) the most recent tensors, the remainder re-allocated."""
    order = [n for n, _ in phase_starts]
    first, last = order.index(phases[0]), order.index(phases[-1])
    begin = phase_starts[first][1]
    end = phase_starts[last + 1][1] if last + 1 < len(phase_starts) else len(events)
    r = _Tensors()
    live: tuple[int, ...] = ()
    live_keys: tuple[str, ...] = ()
    marks: list[tuple[str, int]] = []
    k = first
    for i, (kind, key, dev, n) in enumerate(events[:end]):
        if i == begin:
            live, live_keys = r.restart()
        if r.ops is not None:
            while k <= last and phase_starts[k][1] <= i:
                marks.append((phase_starts[k][0], len(r.ops)))
                k += 1
        if include is not None and not include(key, dev):
            continue
        if kind == "alloc":
            r.alloc(key, n)
        else:
            r.free(key, n)
    if r.ops is None:  # nothing recorded in the window
        live, live_keys = r.restart()
    while k <= last:
        marks.append((phase_starts[k][0], len(r.ops)))  # type: ignore[arg-type]
        k += 1
    return AllocSequence(live=live, ops=tuple(r.ops or ()), marks=tuple(marks), keys=tuple(r.keys), source="ledger")


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulatedPhase:
    phase: str
    allocated_peak_bytes: int
    reserved_peak_bytes: int
    oom_relevant_peak_bytes: int
    """``nonreleasable_bytes`` peak: what a CUDA OOM depends on (``device_caching``)."""
    allocations: int
    requested_peak_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Simulated:
    start_reserved_bytes: int
    phases: tuple[SimulatedPhase, ...]

    def phase(self, name: str) -> SimulatedPhase:
        return next(p for p in self.phases if p.phase == name)

    @property
    def reserved_peak_bytes(self) -> int:
        return max(p.reserved_peak_bytes for p in self.phases)

    @property
    def oom_relevant_peak_bytes(self) -> int:
        return max(p.oom_relevant_peak_bytes for p in self.phases)


def simulate(seq: AllocSequence, conf: AllocConf | None = None, *, skip: Iterable[int] = ()) -> Simulated:
    """``seq`` through a fresh ``CudaCachingAllocator`` (one stream, unlimited); ``skip``: ids left out."""
    sim = CudaCachingAllocator(conf or AllocConf())
    s = sim.stats
    left_out = set(skip)
    blocks: dict[int, object] = {}
    for tid, n in enumerate(seq.live):
        if tid not in left_out:
            blocks[tid] = sim.malloc(n)
    start_reserved = s.reserved_bytes.current
    next_id = len(seq.live)
    bounds = [i for _, i in seq.marks] + [len(seq.ops)]
    out = []
    for k, (name, begin) in enumerate(seq.marks):
        s.reset_peaks()
        oom = s.nonreleasable_bytes.current
        req = s.requested_bytes.current
        count = 0
        for n in seq.ops[begin:bounds[k + 1]]:
            if n > 0:
                tid, next_id = next_id, next_id + 1
                if tid in left_out:
                    continue
                blocks[tid] = sim.malloc(n)
                count += 1
                oom = max(oom, s.nonreleasable_bytes.current)
                req = max(req, s.requested_bytes.current)
            else:
                b = blocks.pop(~n, None)
                if b is not None:
                    sim.free(b)  # type: ignore[arg-type]
        out.append(SimulatedPhase(phase=name, allocated_peak_bytes=s.allocated_bytes.peak,
                                  reserved_peak_bytes=s.reserved_bytes.peak, oom_relevant_peak_bytes=oom,
                                  allocations=count, requested_peak_bytes=req))
    return Simulated(start_reserved_bytes=start_reserved, phases=tuple(out))


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseAlignment:
    phase: str
    matched: tuple[tuple[int, int], ...]
    """(ledger id, recorded id) of tensors matched by size, in order."""
    ledger_unmatched: tuple[int, ...]
    recorded_unmatched: tuple[int, ...]
    ledger_bytes: int
    recorded_bytes: int
    matched_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Alignment:
    live_matched_bytes: int
    live_ledger_bytes: int
    live_recorded_bytes: int
    phases: tuple[PhaseAlignment, ...] = field(default=())

    def phase(self, name: str) -> PhaseAlignment:
        return next(p for p in self.phases if p.phase == name)


def _match(ledger: list[tuple[int, int]], recorded: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """In-order matching by size: each ledger tensor takes the first recorded tensor of its size after
    the previous match; one that finds none is skipped (unmatched)."""
    by_size: dict[int, list[int]] = {}
    for pos, (_, n) in enumerate(recorded):
        by_size.setdefault(n, []).append(pos)
    cursor: dict[int, int] = {}
    last = -1
    out = []
    from bisect import bisect_right
    for lid, n in ledger:
        positions = by_size.get(n)
        if not positions:
            continue
        j = bisect_right(positions, last, lo=cursor.get(n, 0))
        if j == len(positions):
            continue
        cursor[n] = j + 1
        last = positions[j]
        out.append((lid, recorded[last][0]))
    return out


def align(ledger: AllocSequence, recorded: AllocSequence, phases: Sequence[str] | None = None) -> Alignment:
    """Tensor by tensor, per phase (``phases``: default the ledger's marks): see the module docstring."""
    lsz = ledger.sizes
    live = _match(list(enumerate(ledger.live)), list(enumerate(recorded.live)))
    out = []
    for name in phases or [n for n, _ in ledger.marks]:
        la, ra = ledger.allocations(name), recorded.allocations(name)
        m = _match(la, ra)
        ml, mr = {a for a, _ in m}, {b for _, b in m}
        out.append(PhaseAlignment(
            phase=name, matched=tuple(m), ledger_unmatched=tuple(i for i, _ in la if i not in ml),
            recorded_unmatched=tuple(i for i, _ in ra if i not in mr), ledger_bytes=sum(n for _, n in la),
            recorded_bytes=sum(n for _, n in ra), matched_bytes=sum(lsz[a] for a, _ in m)))
    return Alignment(live_matched_bytes=sum(lsz[a] for a, _ in live), live_ledger_bytes=sum(ledger.live),
                     live_recorded_bytes=sum(recorded.live), phases=tuple(out))
