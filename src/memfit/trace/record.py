"""A traced step's raw record (the tracker's log, events and marks) and the ``TraceResult`` made from it.

``memfit.trace.step.record_step`` returns a ``StepRecord``; ``trace_result`` replays its log once to
find what was live at each peak and at the ends of forward and backward. ``memfit.trace.layer_reuse``
builds a ``StepRecord`` for an N-layer model from the record of a shorter one, and goes through the same
``trace_result``, so a reused trace and a full one share every line that turns a log into figures.
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.trace import tracker as tk
from memfit.trace.results import (
    CATEGORIES,
    MemoryBreakdown,
    ModuleBytes,
    StepEvent,
    TracedModule,
    TracedParam,
    TraceOptions,
    TracePeak,
    TraceResult,
    TraceTimings,
)

_PARAM_CATS = frozenset({tk.PARAM_TRAINABLE, tk.PARAM_FROZEN, tk.BUFFER})


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamRecord:
    """One parameter as traced, with the bytes its storage counts for."""

    name: str
    numel: int
    element_bytes: int
    trainable: bool
    rounded_bytes: int
    """Its storage's bytes rounded up to the trace's granularity (``tracker.round_up``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    """The raw record of one traced step."""

    model_type: str
    architecture: str
    method: str
    options: TraceOptions
    names: tuple[str, ...]
    """``named_modules`` names; module indices in ``log`` and ``events`` point here."""
    params: tuple[ParamRecord, ...]
    module_params: tuple[tuple[int, ...], ...]
    """Per module, the indices of the params it owns directly."""
    log: list[tuple]
    """The tracker's log up to the end of backward (``tracker.ALLOC``/``FREE``/``RECAT`` records)."""
    events: tuple[tuple[str, int, int, int, int], ...]
    """The tracker's events: (kind, module, param, activation bytes, highest since the last event)."""
    marks: tuple[tuple[int, int], ...]
    """``AllocationTracker.marks``: where each event and each ``set_phase`` fell in the log."""
    end_forward_at: int
    timings: TraceTimings

    def phase_start(self, phase: int) -> int:
        return next(at for at, code in self.marks if code == -1 - phase)


def peaks_of(log: list[tuple], phase_starts: tuple[int, int]) -> tuple[int, int]:
    """Where each phase's live bytes first reach their highest (``AllocationTracker.track``'s rule:
    the peak starts at the phase's first instant and moves only on a strictly higher total)."""
    current = 0
    peak = [0, 0]
    peak_at = [phase_starts[0], phase_starts[1]]
    live: dict[int, int] = {}
    for i, rec in enumerate(log):
        for phase in (0, 1):
            if i == phase_starts[phase]:
                peak[phase] = current
        kind = rec[0]
        if kind == tk.ALLOC:
            live[rec[1]] = rec[2]
            current += rec[2]
            phase = 1 if i >= phase_starts[1] else 0 if i >= phase_starts[0] else -1
            if phase >= 0 and current > peak[phase]:
                peak[phase] = current
                peak_at[phase] = i + 1
        elif kind == tk.FREE:
            current -= live.pop(rec[1], 0)
    return peak_at[0], peak_at[1]


def trace_result(record: StepRecord) -> TraceResult:
    """The ``TraceResult`` of a step record: its peaks, breakdowns and module events."""
    log, names, options = record.log, list(record.names), record.options
    peak_at = peaks_of(log, (record.phase_start(0), record.phase_start(1)))
    end_forward_at, end_backward_at = record.end_forward_at, len(log)
    snapshots = tk.replay_log(log, [peak_at[0], peak_at[1], end_forward_at, end_backward_at])
    return TraceResult(
        model_type=record.model_type,
        architecture=record.architecture,
        method=record.method,
        options=options,
        params=tuple(TracedParam(name=p.name, numel=p.numel, element_bytes=p.element_bytes, trainable=p.trainable)
                     for p in record.params),
        modules=tuple(TracedModule(name=n, params=record.module_params[i]) for i, n in enumerate(names)),
        param_bytes=sum(p.rounded_bytes for p in record.params),
        trainable_param_bytes=sum(p.rounded_bytes for p in record.params if p.trainable),
        forward=_peak("forward", snapshots[peak_at[0]], log, peak_at[0], names),
        backward=_peak("backward", snapshots[peak_at[1]], log, peak_at[1], names),
        end_of_forward=_breakdown(snapshots[end_forward_at]),
        end_of_backward=_breakdown(snapshots[end_backward_at]),
        events=_step_events(list(record.events), names),
        timings=record.timings,
    )


def _breakdown(live: dict[int, list]) -> MemoryBreakdown:
    totals = [0] * len(CATEGORIES)
    for nbytes, cat, _module, _op in live.values():
        totals[cat] += nbytes
    return MemoryBreakdown(**{f"{c}_bytes": totals[i] for i, c in enumerate(CATEGORIES)})


def _module_name(names: list[str], idx: int) -> str:
    if idx == tk.NO_MODULE:
        return "<outside modules>"
    return names[idx] or "<root>"


def _peak(phase: str, live: dict[int, list], log: list[tuple], at: int, names: list[str]) -> TracePeak:
    by: dict[tuple[int, int], int] = {}
    for nbytes, cat, module, _op in live.values():
        if cat in _PARAM_CATS:
            continue
        by[(module, cat)] = by.get((module, cat), 0) + nbytes
    rows = sorted(by.items(), key=lambda kv: -kv[1])
    last = log[at - 1] if at > 0 else None
    module, op = tk.NO_MODULE, ""
    if last is not None and last[0] == tk.ALLOC:
        module, op = last[4], str(last[5]) if last[5] is not None else ""
    return TracePeak(
        phase=phase,
        peak_bytes=sum(v[0] for v in live.values()),
        breakdown=_breakdown(live),
        by_module=tuple(
            ModuleBytes(module=_module_name(names, m), category=CATEGORIES[c], bytes=b) for (m, c), b in rows
        ),
        module=_module_name(names, module),
        op=op,
    )


def _step_events(raw: list[tuple[str, int, int, int, int]], names: list[str]) -> tuple[StepEvent, ...]:
    """Tracker events with backward ``node`` marks turned into ``bwd_pre``/``bwd_post`` per module.

    A module's backward spans from the first to the last autograd node created under it or under
    one of its children (what DeepSpeed's pre-/post-backward hooks bracket); ``bwd_pre`` is emitted
    outermost first, ``bwd_post`` innermost first.
    """
    index = {n: i for i, n in enumerate(names)}
    chains: dict[int, tuple[int, ...]] = {}

    def chain(m: int) -> tuple[int, ...]:
        if m not in chains:
            parts = names[m].split(".") if names[m] else []
            chains[m] = tuple(index[".".join(parts[:k])] for k in range(len(parts) + 1) if ".".join(parts[:k]) in index)
        return chains[m]

    last: dict[int, int] = {}
    for j, (kind, module, *_rest) in enumerate(raw):
        if kind == "node":
            for a in chain(module):
                last[a] = j
    depth = {i: (n.count(".") + 1 if n else 0) for i, n in enumerate(names)}
    out: list[StepEvent] = []
    open_: set[int] = set()
    pending = 0
    for j, (kind, module, param, act, act_peak) in enumerate(raw):
        pending = max(pending, act_peak)
        if kind == "node" or kind == "end_backward":
            closing = [a for a in open_ if last[a] < j] if kind == "node" else list(open_)
            for a in sorted(closing, key=lambda a: -depth[a]):
                out.append(StepEvent(kind="bwd_post", module=a, act_bytes=act, act_peak_bytes=pending))
                pending = act
                open_.discard(a)
            if kind == "node":
                for a in chain(module):
                    if a not in open_:
                        open_.add(a)
                        out.append(StepEvent(kind="bwd_pre", module=a, act_bytes=act, act_peak_bytes=pending))
                        pending = act
                continue
        out.append(StepEvent(kind=kind, module=module, param=param, act_bytes=act, act_peak_bytes=pending))
        pending = act
    return tuple(out)
