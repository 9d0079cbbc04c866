"""An epoch of steady-state steps through one CUDA caching allocator (issue 19 item 1).

``simulate_epoch(sc, timeline)`` takes the plan's timeline (written at the longest batch) and:

1. fits the step template (``template.py``) from the plan's steady-state step and the same step
   written at half and a quarter of that length (two more runs of the recipes, without the
   allocator simulation);
2. brings a fresh ``CudaCachingAllocator`` (the scenario's torch version and
   ``PYTORCH_CUDA_ALLOC_CONF``: ``expandable_segments``, ``garbage_collection_threshold``,
   ``max_split_size_mb`` act as they do in the plan) to the state the plan's allocator had when step 2
   began, by replaying every GPU event before it;
3. runs the epoch's optimizer steps (``shapes.py``) one after the other through it: blocks cached by
   a long batch are split or reused by shorter ones, new segments are added when nothing cached fits;
   ``torch_empty_cache_steps`` flushes the cache after the forward of every step whose global step is
   a multiple of it (``Trainer.training_step``: ``clear_device_cache()`` between ``compute_loss`` and
   ``backward``); with ``eval_strategy`` steps the evaluation's events run every ``eval_steps``.

The figures per step are torch's: the peak of ``reserved_bytes`` and of ``allocated_bytes`` within the
step, and memfit's OOM-relevant peak (segments holding a live block + memory outside PyTorch, as the
plan's phases); the summary gives p50, p99 and max over the steps, the step and batch shape of the
peak and how often that shape occurs, and the peak step's phases (``epoch.*``, which the verdict judges).

Cost: a step already simulated from the same allocator state (the free blocks of both pools and the
reserved bytes: ``state_key``) at the same length, and which left the state as it found it, is not
simulated again (``memo``); that is what a cache that has stopped growing does. The allocator calls
are bounded by ``EVENT_BUDGET``: past it, a step takes the figures of the last step of its length
that was simulated and the allocator state is kept as it is; the summary counts those steps. The
seam for a faster allocator is ``AllocatorRun``: ``run(ops)`` (``core/alloc/ops.py``'s ``run_ops``: the
allocator's malloc and free in one loop, the same blocks and stats) and ``state_key()``.
"""

from __future__ import annotations

import math
from dataclasses import replace

from memfit.core.lean_dataclass import dataclass
from memfit.core.alloc.device_caching import CudaCachingAllocator
from memfit.core.alloc.ops import run_ops
from memfit.core.epoch.shapes import EpochShapes, default_distribution, epoch_shapes
from memfit.core.epoch.template import (STEP_END, STEP_START, Resolved, StepTemplate, TemplateError, resolve,
                                        resolve_windows)
from memfit.core.ledger_types import EpochSummary, PhaseLedger
from memfit.core.scenario.types import EvalSettings, Scenario

MAX_STEPS = 1000
"""Optimizer steps simulated when the epoch is longer (or not given): the first 1,000 of it."""
EVENT_BUDGET = 150_000
"""Allocator calls the epoch may make (about 0.16 s at ~1.1 us per call through ``core/alloc/ops.py``'s loop,
measured on the 2-core development machine; ~2.5 us per call through ``malloc``/``free``)."""


class AllocatorRun:
    """The seam between the epoch and the allocator simulator: ``run`` replays ops (``(is_alloc,
    tensor id, bytes)``) on live tensors named by id; ``state_key`` names the allocator's state."""

    def __init__(self, alloc: CudaCachingAllocator) -> None:
        self.alloc = alloc
        self.handles: dict[int, object] = {}

    def run(self, kinds, tids, sizes, start: int, end: int) -> None:  # noqa: ANN001
        run_ops(self.alloc, kinds, tids, sizes, self.handles, start, end)

    def state_key(self) -> tuple:
        a = self.alloc
        return (a.stats.reserved_bytes.current, tuple(a.small.keys), tuple(a.large.keys))


@dataclass(slots=True)
class _StepFigures:
    reserved: int
    oom: int
    allocated: int
    phases: tuple[tuple[int, int, int], ...]
    """(reserved, OOM-relevant, allocated) peaks of forward, backward, optimizer step."""


def simulate_epoch(sc: Scenario, timeline) -> EpochSummary | None:  # noqa: ANN001
    """The epoch (module docstring); None when the scenario does not simulate one."""
    ep = sc.epoch
    if not ep.simulate or sc.accelerator != "cuda" or timeline.tracker is None:
        return None
    dist = ep.lengths or default_distribution(sc.train.seq_len)
    source = dist.source if ep.lengths else (f"assumed: {dist.source} (no --lengths given; pass the dataset's "
                                             "token counts for the real shapes)")
    b, world = sc.train.micro_batch, sc.world_size
    ga = sc.torch.gradient_accumulation_steps if sc.framework != "deepspeed" else \
        max(sc.deepspeed.gradient_accumulation_steps, 1)
    per_epoch = _steps_per_epoch(dist, ep.rule, b, world, ga, ep.max_seq_length)
    steps = ep.steps or min(per_epoch, MAX_STEPS)
    shapes = epoch_shapes(dist, rule=ep.rule, micro_batch=b, world=world, grad_accum=ga, steps=steps,
                          max_seq_length=ep.max_seq_length or sc.train.seq_len, seed=ep.seed, source=source)
    notes = []
    if ga > 1:
        notes.append(f"With gradient accumulation ({ga} micro-steps) each optimizer step is simulated at the longest "
                     "of its micro-batches, as the ledger's steady-state step: the earlier micro-steps' activations "
                     "(freed before the last one) are not replayed one by one.")
    if world > 1:
        notes.append(f"Rank 0's batches of {world} ranks (each rank draws its own).")
    try:
        first, template, plan_step = _template(sc, timeline, shapes.lengths)
    except TemplateError as exc:
        return EpochSummary(steps=0, simulated=0, from_memo=0, approximated=0, per_epoch=per_epoch, lengths_source=source,
                            rule=ep.rule, quantum=shapes.quantum, distinct_lengths=0, error=str(exc))
    run = seeded_run(sc, timeline.tracker.gpu.conf, plan_step)
    eval_every = sc.eval.steps if sc.eval.enabled and sc.eval.strategy == "steps" else None
    out = run_epoch(run, first, template, shapes.lengths, empty_n=ep.empty_cache_steps, outside=plan_step.outside_bytes,
                    eval_ops=_eval_ops(sc, timeline), eval_every=eval_every)
    if out.inexact:
        notes.append(f"{out.inexact:,} event sizes were not exactly quadratic in the length at a length simulated: "
                     "rounded up")
    return _summary(sc, shapes, out.figures, per_epoch=per_epoch, simulated=out.simulated, hits=out.hits,
                    approx=out.approx, template=template, notes=tuple(notes), eval_fig=out.eval_fig,
                    outside=plan_step.outside_bytes)


def seeded_run(sc: Scenario, conf, step1: Resolved) -> AllocatorRun:  # noqa: ANN001
    """A fresh allocator brought to the state the plan's had when step 1 began (every GPU op before)."""
    total = sc.hardware.gpu.total_bytes
    run = AllocatorRun(CudaCachingAllocator(conf, capacity_bytes=total - step1.outside_bytes, device_total_bytes=total,
                                            force_on_oom=True))
    before = step1.before
    run.run(tuple(o[0] for o in before), tuple(o[1] for o in before), tuple(o[2] for o in before), 0, len(before))
    return run


@dataclass(slots=True)
class EpochRun:
    figures: list[_StepFigures]
    simulated: int = 0
    hits: int = 0
    approx: int = 0
    inexact: int = 0
    calls: int = 0
    eval_fig: tuple[int, int, int] | None = None


def run_epoch(run: AllocatorRun, first, steady, lengths: tuple[int, ...], *, empty_n: int | None, outside: int,
              eval_ops=None, eval_every: int | None = None, memo: bool = True,  # noqa: ANN001
              budget: int = EVENT_BUDGET) -> EpochRun:
    """The steps of ``lengths`` through ``run``: step 1 from ``first``, the rest from ``steady`` (each a
    step source: ``kinds``, ``tids``, ``backward_at``, ``optimizer_at``, ``carry_in``, ``carry_out`` and
    ``sizes(length)``: a ``StepTemplate``, or the recipes' own steps in the tests). ``memo`` and
    ``budget``: the shortcuts of the module docstring (off: every step is simulated)."""
    out = EpochRun(figures=[])
    seen: dict[tuple, tuple[_StepFigures, tuple]] = {}
    last_of_length: dict[int, _StepFigures] = {}
    sizes_of: dict[int, tuple[int, ...]] = {}
    carried: dict[str, list[object]] = {}
    for k, L in enumerate(lengths):
        empty = bool(empty_n) and k % empty_n == 0  # the Trainer's global_step: steps completed before this one
        if k == 0:  # step 1: the optimizer states are created, ZeRO-3 records its trace
            sizes, bad = first.sizes(L)
            out.inexact += bad
            out.figures.append(_run_step(run, first, sizes, empty=empty, outside=outside))
            out.calls += len(first.kinds)
            out.simulated += 1
            continue
        key = (run.state_key(), L, empty) if memo else None
        hit = seen.get(key) if memo else None
        if hit is not None and hit[1] == key[0]:
            out.figures.append(hit[0])
            out.hits += 1
            continue
        n_ops = len(steady.kinds)
        if memo and out.calls + n_ops > budget and L in last_of_length:
            out.figures.append(last_of_length[L])
            out.approx += 1
            continue
        if L not in sizes_of:
            sizes_of[L], bad = steady.sizes(L)
            out.inexact += bad
        for tkey, tid in steady.carry_in:  # step 2 frees the plan's own tensors; later steps those before them
            if carried.get(tkey):
                run.handles[tid] = carried[tkey].pop(0)
        fig = _run_step(run, steady, sizes_of[L], empty=empty, outside=outside)
        carried = {}
        for tkey, tid in steady.carry_out:
            carried.setdefault(tkey, []).append(run.handles[tid])
        out.calls += n_ops
        out.simulated += 1
        if memo:
            seen[key] = (fig, run.state_key())
        last_of_length[L] = fig
        out.figures.append(fig)
        if eval_ops is not None and eval_every and (k + 1) % eval_every == 0 and out.calls + len(eval_ops[0]) <= budget:
            out.eval_fig = _run_eval(run, eval_ops, outside, out.eval_fig)
            out.calls += len(eval_ops[0])
    return out


def _steps_per_epoch(dist, rule: str, b: int, world: int, ga: int, cap: int | None) -> int:  # noqa: ANN001
    if rule == "pack" and cap:
        tokens = sum(n * c for n, c in zip(dist.lengths, dist.counts))
        return max(math.ceil(math.ceil(tokens / cap) / (b * world * ga)), 1)
    return max(math.ceil(dist.samples / (b * world * ga)), 1)


def _template(sc: Scenario, timeline, lengths: tuple[int, ...]):  # noqa: ANN001
    """The templates of step 1 (``forward`` up to step 2) and of the steady state, from the plan's own
    timeline and two more at shorter lengths; and the plan's step 1 resolved (what comes before it)."""
    from memfit.core.ledger.build import build_events_timeline

    L = sc.train.seq_len
    if set(lengths) <= {L}:  # every batch at the planned length (packing, fixed shapes): the plan's own step
        first, steady = resolve_windows(timeline, (("forward", ("step2.forward",)), (STEP_START, STEP_END)))
        return FixedStep(first, L), FixedStep(steady, L), first
    others = [x for x in dict.fromkeys((max(L // 2, 1), max(L // 4, 1), L + 1, L + 2)) if x != L][:2]
    timelines = {L: timeline}
    cache: dict = {}
    for x in others:
        other = replace(sc, train=replace(sc.train, seq_len=x), eval=EvalSettings(), epoch=replace(sc.epoch, simulate=False))
        timelines[x] = build_events_timeline(other, model_cache=cache)
    both = {x: resolve_windows(t, (("forward", ("step2.forward",)), (STEP_START, STEP_END))) for x, t in timelines.items()}
    first, steady = {x: r[0] for x, r in both.items()}, {x: r[1] for x, r in both.items()}
    return StepTemplate.build(first), StepTemplate.build(steady), first[L]


class FixedStep:
    """A step source of one length (every batch the same shape): the plan's own resolved step."""

    def __init__(self, r: Resolved, length: int) -> None:
        self.kinds = tuple(o[0] for o in r.ops)
        self.tids = tuple(o[1] for o in r.ops)
        self._sizes = tuple(o[2] for o in r.ops)
        self.carry_in, self.carry_out = r.carry_in, r.carry_out
        self.backward_at, self.optimizer_at = r.backward_at, r.optimizer_at
        self.lengths = (length,)

    def sizes(self, length: int) -> tuple[tuple[int, ...], int]:
        if length not in self.lengths:
            raise TemplateError(f"a fixed step has length {self.lengths[0]} only, not {length}")
        return self._sizes, 0


def _run_step(run: AllocatorRun, tp: StepTemplate, sizes: tuple[int, ...], *, empty: bool, outside: int) -> _StepFigures:
    a = run.alloc
    s = a.stats
    out = []
    bounds = ((0, tp.backward_at), (tp.backward_at, tp.optimizer_at), (tp.optimizer_at, len(tp.kinds)))
    for i, (lo, hi) in enumerate(bounds):
        if i == 1 and empty:
            a.empty_cache()
        s.reset_peaks()
        run.run(tp.kinds, tp.tids, sizes, lo, hi)
        out.append((s.reserved_bytes.peak, s.nonreleasable_bytes.peak + outside, s.allocated_bytes.peak))
    return _StepFigures(reserved=max(x[0] for x in out), oom=max(x[1] for x in out), allocated=max(x[2] for x in out),
                        phases=tuple(out))


def _eval_ops(sc: Scenario, timeline):  # noqa: ANN001
    """The plan's evaluation phases as ops (fixed shape), or None when the run does not evaluate."""
    if not sc.eval.enabled:
        return None
    try:
        r = resolve(timeline, start="eval.forward", ends=("save",))
    except TemplateError:
        return None
    if r.carry_in or r.carry_out:
        return None
    return (tuple(o[0] for o in r.ops), tuple(o[1] + 10**9 for o in r.ops), tuple(o[2] for o in r.ops))


def _run_eval(run: AllocatorRun, ops, outside: int, prev):  # noqa: ANN001
    s = run.alloc.stats
    s.reset_peaks()
    kinds, tids, sizes = ops
    run.run(kinds, tids, sizes, 0, len(kinds))
    fig = (s.reserved_bytes.peak, s.nonreleasable_bytes.peak + outside, s.allocated_bytes.peak)
    return fig if prev is None else tuple(max(x, y) for x, y in zip(fig, prev))


def _pct(values: list[int], q: float) -> int:
    s = sorted(values)
    return s[max(math.ceil(q * len(s)) - 1, 0)]


def _summary(sc: Scenario, shapes: EpochShapes, figs: list[_StepFigures], *, per_epoch: int, simulated: int, hits: int,
             approx: int, template: StepTemplate, notes: tuple[str, ...], eval_fig, outside: int) -> EpochSummary:  # noqa: ANN001
    oom = [f.oom for f in figs]
    res = [f.reserved for f in figs]
    k = max(range(len(figs)), key=lambda i: (figs[i].oom, figs[i].reserved))
    L = shapes.lengths[k]
    count = sum(1 for x in shapes.lengths if x == L)
    return EpochSummary(
        steps=len(figs), simulated=simulated, from_memo=hits, approximated=approx, per_epoch=per_epoch,
        lengths_source=shapes.source, rule=shapes.rule, quantum=shapes.quantum,
        distinct_lengths=len(set(shapes.lengths)), reserved_p50_bytes=_pct(res, 0.5), reserved_p99_bytes=_pct(res, 0.99),
        reserved_max_bytes=max(res), oom_relevant_p50_bytes=_pct(oom, 0.5), oom_relevant_p99_bytes=_pct(oom, 0.99),
        oom_relevant_max_bytes=max(oom), allocated_max_bytes=max(f.allocated for f in figs), peak_step=k + 1,
        peak_seq_len=L, peak_micro_batch=shapes.micro_batch, peak_shape_steps=count,
        peak_phase_figures=figs[k].phases, template_lengths=template.lengths, outside_bytes=outside,
        eval_figures=eval_fig, notes=notes)


def epoch_phases(sc: Scenario, summary: EpochSummary, phases: tuple[PhaseLedger, ...]) -> tuple[PhaseLedger, ...]:
    """The peak step as phases (``epoch.forward``, ``epoch.backward``, ``epoch.optimizer_step``): the
    steady-state phases' items (the plan's, at its longest batch; at the peak step's length from a
    plan written there when it is shorter), with the allocator figures the epoch's cache gave them."""
    if summary.error or not summary.steps:
        return ()
    src = plan_src = {p.name: p for p in phases}
    if summary.peak_seq_len != sc.train.seq_len:  # the items at the peak step's length (requested bytes; the
        from memfit.core.ledger.build import build_events_timeline  # allocator figures are the epoch's)

        at = replace(sc, train=replace(sc.train, seq_len=summary.peak_seq_len), eval=EvalSettings(),
                     epoch=replace(sc.epoch, simulate=False))
        src = {p.name: p for p in build_events_timeline(at).phases()}
    out = []
    for (name, fig) in zip(("forward", "backward", "optimizer_step"), summary.peak_phase_figures):
        base, plan_base = src.get(f"step2.{name}"), plan_src.get(f"step2.{name}")
        if base is None or plan_base is None:
            continue
        reserved, oom, allocated = fig
        out.append(replace(
            base, name=f"epoch.{name}",
            description=(f"the epoch's peak step (step {summary.peak_step} of {summary.steps} simulated, "
                         f"{summary.peak_micro_batch} x {summary.peak_seq_len:,} tokens): {name.replace('_', ' ')}, "
                         "with the cache the earlier steps left"),
            allocators_simulated=True, gpu_reserved_bytes=reserved, gpu_oom_relevant_bytes=oom, gpu_allocated_bytes=allocated,
            gpu_outside_pytorch_bytes=summary.outside_bytes, gpu_nvidia_smi_bytes=reserved + summary.outside_bytes,
            cpu_pinned_requested_bytes=plan_base.cpu_pinned_requested_bytes,
            cpu_pinned_locked_bytes=plan_base.cpu_pinned_locked_bytes, cpu_locked_peak_bytes=plan_base.cpu_locked_peak_bytes,
            node_cpu_locked_peak_bytes=plan_base.node_cpu_locked_peak_bytes))
    return tuple(out)
