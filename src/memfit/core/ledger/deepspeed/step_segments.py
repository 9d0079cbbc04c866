"""A training step cut into segments, one per transformer block, with what each one allocates.

The in-step phases (``memfit.core.ledger.deepspeed.step``) are built from three kinds of allocations that
run side by side: activations (one set per block, ``memfit.core.activations.analytic``), ZeRO-3's gathered
parameters (``zero3_fetch.Coordinator`` over ``module_order``) and gradients (per parameter, with
the reduce buckets DeepSpeed fills). The step is cut where the blocks start and end (forward) or
where their backward starts and ends (backward): segment ``2k-1`` is block ``k``, ``2k`` what runs
between block ``k`` and block ``k+1`` (the last one: the final norm, the head and the loss),
segment ``0`` what runs before the first block (embeddings, a prefix encoder). In backward, the
segments are in backward order (head first), plus a last one for the end of the backward
(``release_backward_leftovers`` and the next ``reset_step``).

Within a segment the ledger places a block's activations (or, in backward, its checkpoint
recompute and its gradients) at the segment's highest point of gathered parameters between two
hooks: a module computes after its ``fetch_sub_module`` has returned, and by then a coalesced
all-gather's flat buffer whose params are all fetched is gone (``AllGatherCoalescedHandle.wait``
copies the params out; the handle dies when the last is popped from the in-flight registry), so
the highest point inside a fetch (flat buffer and copies together) comes before that module's
tensors, as the replays log it at the LM head. Within a block this puts all its tensors at one
point (they are made module by module); between blocks (the head) it is what runs. Everything
here is memoized per the settings it depends on, so the recommender's estimator (``memfit.core.recommend.deepspeed.estimate``) combines the same
per-segment numbers the ledger allocates, without walking the parameters per candidate.
"""

from __future__ import annotations

from collections.abc import Sequence

from memfit.core.lean_dataclass import dataclass
from memfit.core.ledger.deepspeed.module_order import ModuleOrder, build_module_order
from memfit.core.ledger.deepspeed.zero3_fetch import AG_STAGING, Coordinator, FetchStat, GParam

Event = tuple[str, int]
"""``(ledger key, +bytes)`` for an allocation, ``(ledger key, -bytes)`` for a free of one tensor."""


@dataclass(frozen=True, slots=True)
class StepLayout:
    """The module order and where its segments start, for one scenario (and checkpointing)."""

    order: ModuleOrder
    forward_segment: tuple[int, ...]
    """Per forward event, its segment."""
    backward_segment: tuple[int, ...]
    """Per backward event, its segment."""
    n_segments: int
    """Segments of a pass direction (``2 x blocks + 1``; 1 when no block is recognised)."""
    grad_order: tuple[int, ...]
    """Trained parameter indices in the order their gradients are ready (backward order)."""
    grad_segment: tuple[int, ...]
    """Per entry of ``grad_order``, the backward segment where its gradient appears."""

    @property
    def blocks(self) -> int:
        return len(self.order.layers)


def build_layout(names: Sequence[str], numels: Sequence[int], trainable: Sequence[bool], *, num_layers: int,
                 checkpointing: bool, parallel_blocks: bool = False, prefix_kv: bool = False) -> StepLayout:
    """``parallel_blocks``/``prefix_kv``: ``module_order.flow_flags`` of the scenario."""
    order = build_module_order(names, numels, trainable, num_layers=num_layers, checkpointing=checkpointing,
                               parallel_blocks=parallel_blocks, prefix_kv=prefix_kv)
    layer_index = {m: k for k, m in enumerate(order.layers)}
    nseg = 2 * len(order.layers) + 1
    fwd, seg = [], 0
    for is_pre, m in order.forward:
        if is_pre and m in layer_index:
            seg = 2 * layer_index[m] + 1
        fwd.append(seg)
        if not is_pre and m in layer_index:
            seg = 2 * layer_index[m] + 2
    L = len(order.layers)
    bwd, seg = [], 0
    for (is_pre, m), recompute in zip(order.backward, order.backward_forward):
        if not recompute and is_pre and m in layer_index:
            seg = 2 * (L - 1 - layer_index[m]) + 1
        bwd.append(seg)
        if not recompute and not is_pre and m in layer_index:
            seg = 2 * (L - 1 - layer_index[m]) + 2
    # gradients: a module's trained params, when its backward runs (its first backward event),
    # in reverse registration order
    first_bwd: dict[int, int] = {}
    for pos, ((is_pre, m), recompute) in enumerate(zip(order.backward, order.backward_forward)):
        if not recompute and m not in first_bwd:
            first_bwd[m] = pos
    grad_order, grad_seg = [], []
    for m, pos in sorted(first_bwd.items(), key=lambda kv: kv[1]):
        for p in reversed(order.params[m]):
            if trainable[p]:
                grad_order.append(p)
                grad_seg.append(bwd[pos])
    return StepLayout(order=order, forward_segment=tuple(fwd), backward_segment=tuple(bwd), n_segments=nseg,
                      grad_order=tuple(grad_order), grad_segment=tuple(grad_seg))


@dataclass(frozen=True, slots=True)
class Segment:
    """What one segment allocates and frees, in order, and where the step's own items go in."""

    events: tuple[Event, ...]
    split: int
    """``events[:split]`` run before the step's own items of the segment (its block's activations,
    gradients), at the segment's highest point among the places allowed (ZeRO-3: after a hook)."""
    peak: int
    """Bytes of these items live at that point, counted from the start of the pass."""
    before: int = 0
    """Highest bytes of these items while ``events[:split]`` run (inside a hook: an all-gather's flat
    buffer and the params copied out of it), at least ``peak``."""
    after: int = 0
    """Highest bytes of these items while ``events[split:]`` run, at least ``peak``."""

    @property
    def top(self) -> int:
        return max(self.before, self.after)


def _segments(events: list[tuple[int, Event]], n: int, start: int = 0,
              marks: set[int] | None = None) -> tuple[tuple[Segment, ...], int]:
    """Cut ``(segment, event)`` pairs into ``n`` segments; returns them and the live bytes at the end.
    ``marks``: positions in ``events`` (after that many events) where a split may go (default: any)."""
    per: list[list[tuple[int, Event]]] = [[] for _ in range(n)]
    for g, (s, ev) in enumerate(events):
        per[s].append((g, ev))
    out = []
    live = start
    for evs in per:
        best, split = live, 0
        states = [live]
        for i, (g, (_, b)) in enumerate(evs):
            live += b
            states.append(live)
            if live > best and (marks is None or g + 1 in marks):
                best, split = live, i + 1
        out.append(Segment(events=tuple(ev for _, ev in evs), split=split, peak=best,
                           before=max(states[:split + 1]), after=max(states[split:])))
    return tuple(out), live


class _Recorder:
    """A ``zero3_fetch.Sink`` that keeps the events with the current segment, and where each hook
    ended (``marks``)."""

    __slots__ = ("events", "seg", "marks")

    def __init__(self) -> None:
        self.events: list[tuple[int, Event]] = []
        self.seg = 0
        self.marks: set[int] = set()

    def mark(self) -> None:
        self.marks.add(len(self.events))

    def alloc(self, key: str, nbytes: int) -> None:
        self.events.append((self.seg, (key, nbytes)))

    def free(self, key: str, nbytes: int) -> None:
        self.events.append((self.seg, (key, -nbytes)))


@dataclass(frozen=True, slots=True)
class GatherPass:
    """One forward+backward of the ZeRO-3 coordinator, cut into segments."""

    forward: tuple[Segment, ...]
    backward: tuple[Segment, ...]
    """``n_segments`` segments, then one for the end of the backward."""
    end_forward: int
    """Gathered bytes live when the forward ends."""
    end: int
    """Gathered bytes live after the backward (persistent params kept with a complete trace)."""
    stats: tuple[FetchStat, ...]
    persist_live: tuple[bool, ...]
    """Per param: a persistent param left gathered at the end."""
    persist_bytes: tuple[int, ...]
    """Per param: the bytes of a persistent param's gathered data left at the end (0 if none)."""
    forward_peaks: tuple[int, ...]
    """Per forward segment, the highest bytes once its activations are allocated (``peak``, or
    ``after``: a later hook's all-gather)."""
    forward_before: tuple[int, ...]
    """Per forward segment, ``before``: the highest bytes before its activations are allocated."""
    backward_peaks: tuple[int, ...]
    """``peak`` of each backward segment (where its gradients are made)."""
    backward_before: tuple[int, ...]
    """``before`` of each backward segment (before its gradients)."""
    backward_after: tuple[int, ...]
    """``after`` of each backward segment (after its gradients and the activations it frees)."""
    max_bytes: int
    """Highest bytes of non-persistent gathered data plus coalesced flat buffers at any hook
    (what the replay's coordinator log measures: ``memfit.replay.deepspeed.coordinator_log``)."""


def record_order(layout: StepLayout) -> tuple[int, ...]:
    """The trace a RECORD step leaves (``record_module`` at every ``fetch_sub_module``)."""
    o = layout.order
    return tuple(m for is_pre, m in o.forward if is_pre) + tuple(m for is_pre, m in o.backward if is_pre)


def gather_pass(layout: StepLayout, params: Sequence[GParam], world: int, *, prefetch_bucket_size: int,
                max_live_parameters: int, max_reuse_distance: int, offload_param: bool, allgather_sequential: bool,
                complete: bool, persistent_available: bool, tables: dict | None = None) -> GatherPass:
    """Run the coordinator over the layout's order (RECORD mode unless ``complete``); ``tables``:
    ``Coordinator``'s, shared by the passes over this layout with params of the same numels (the
    recommender's, one per scenario and checkpointing)."""
    co, fwd, bwd, top = _run(layout, params, world, prefetch_bucket_size=prefetch_bucket_size,
                             max_live_parameters=max_live_parameters, max_reuse_distance=max_reuse_distance,
                             offload_param=offload_param, allgather_sequential=allgather_sequential,
                             complete=complete, persistent_available=persistent_available, tables=tables)
    return _pass(layout, params, co, fwd, bwd, top)


def gather_passes_offloaded_and_not(layout: StepLayout, params: Sequence[GParam], world: int, *,
                                    prefetch_bucket_size: int, max_live_parameters: int, max_reuse_distance: int,
                                    allgather_sequential: bool, complete: bool, persistent_available: bool,
                                    tables: dict | None = None) -> tuple[GatherPass, GatherPass]:
    """``gather_pass`` with ``offload_param`` True and False, from one run of the coordinator (``world``
    > 1). With more than one rank the offload changes none of the coordinator's decisions, only adds
    the partitions' copies to the GPU (``AG_STAGING``: ``Coordinator._gather`` and ``register``, the
    only places that read ``offload`` when W > 1), so the pass without it is the same events with
    those taken out (``tests/core/test_gather_pair.py`` compares both with two runs)."""
    if world <= 1:
        raise ValueError("with one rank the offload changes what a gather puts on the GPU: run gather_pass twice")
    co, fwd, bwd, top = _run(layout, params, world, prefetch_bucket_size=prefetch_bucket_size,
                             max_live_parameters=max_live_parameters, max_reuse_distance=max_reuse_distance,
                             offload_param=True, allgather_sequential=allgather_sequential,
                             complete=complete, persistent_available=persistent_available, tables=tables)
    return _pass(layout, params, co, fwd, bwd, top), _pass(layout, params, co, _without(fwd, AG_STAGING),
                                                           _without(bwd, AG_STAGING), top)


def _without(recorded: tuple[list, set[int]], key: str) -> tuple[list, set[int]]:
    """Recorded ``(events, marks)`` with the events of ``key`` taken out, each mark moved back by the
    events taken out before it."""
    events, marks = recorded
    kept = []
    before = [0] * (len(events) + 1)  # before[i]: events kept among the first i
    for i, e in enumerate(events):
        if e[1][0] != key:
            kept.append(e)
        before[i + 1] = len(kept)
    return kept, {before[m] for m in marks}


def _run(layout: StepLayout, params: Sequence[GParam], world: int, *, prefetch_bucket_size: int,
         max_live_parameters: int, max_reuse_distance: int, offload_param: bool, allgather_sequential: bool,
         complete: bool, persistent_available: bool, tables: dict | None):
    """The coordinator over the layout's order: it, the forward's and the backward's recorded
    ``(events, marks)``, and the highest gathered + flat bytes at any hook."""
    o = layout.order
    rec = _Recorder()
    co = Coordinator(params, o.params, world, externals=o.externals, prefetch_bucket_size=prefetch_bucket_size,
                     max_live_parameters=max_live_parameters, max_reuse_distance=max_reuse_distance,
                     offload_param=offload_param, allgather_sequential=allgather_sequential,
                     order=record_order(layout) if complete else None, persistent_available=persistent_available,
                     sink=rec, record_stats=False, tables=tables)
    top = 0
    for (is_pre, m), s in zip(o.forward, layout.forward_segment):
        rec.seg = s
        co.fetch(m, True) if is_pre else co.release(m)
        rec.mark()
        top = max(top, co.gathered_bytes + co.flat_bytes)
    fwd = (rec.events, rec.marks)
    rec.events, rec.marks = [], set()
    for (is_pre, m), recompute, s in zip(o.backward, o.backward_forward, layout.backward_segment):
        rec.seg = s
        co.fetch(m, recompute) if is_pre else co.release(m)
        rec.mark()
        top = max(top, co.gathered_bytes + co.flat_bytes)
    rec.seg = layout.n_segments
    co.finish()
    rec.mark()
    return co, fwd, (rec.events, rec.marks), top


def _pass(layout: StepLayout, params: Sequence[GParam], co: Coordinator, fwd: tuple[list, set[int]],
          bwd: tuple[list, set[int]], top: int) -> GatherPass:
    forward, end_fwd = _segments(fwd[0], layout.n_segments, marks=fwd[1])
    backward, end = _segments(bwd[0], layout.n_segments + 1, end_fwd, marks=bwd[1])
    persist = tuple(q.persist and co.data[i] > 0 for i, q in enumerate(params))
    return GatherPass(forward=forward, backward=backward, end_forward=end_fwd, end=end, stats=tuple(co.stats),
                      persist_live=persist,
                      persist_bytes=tuple(co.data[i] if q.persist else 0 for i, q in enumerate(params)),
                      forward_peaks=tuple(max(x.peak, x.after) for x in forward),
                      forward_before=tuple(x.before for x in forward),
                      backward_peaks=tuple(x.peak for x in backward), backward_before=tuple(x.before for x in backward),
                      backward_after=tuple(x.after for x in backward), max_bytes=top)


# ---------------------------------------------------------------------------------------- gradients
FULL_GRAD = "step.full_gradient"
GRADS = "step.gradients"
RS_FLAT = "zero3.reduce_scatter_flat"
GRAD_COPY = "zero3.grad_partition_gpu_copy"
GRAD_FP32 = "zero3.grad_partition_fp32_copy"
BUCKETS = "zero12.reduce_buckets"
GRADS_PART = "zero12.grads_in_partition"
OLD_IPG = "zero3.ipg_buffers_per_backward"


@dataclass(frozen=True, slots=True)
class GradSpec:
    """How DeepSpeed handles the gradients of one backward (what a ``grad_pass`` depends on)."""

    stage: int
    world: int
    element_bytes: int
    """Gradient dtype (the training dtype)."""
    accum_bytes: int
    """ZeRO-3 grad-accumulation dtype (the partitions' dtype)."""
    reduce_bucket_size: int
    contiguous_gradients: bool
    overlap_comm: bool
    offload_optimizer: bool
    boundary: bool
    """This backward ends the accumulation (``is_gradient_accumulation_boundary``)."""
    micro_step: int
    """0 for the first micro-step of a step, 1 for a later one."""
    grads_in_partition_numel: int
    """ZeRO-2: elements of ``grads_in_partition``, the params of this rank's partition whole
    (``zero012.grads_in_partition_numel``)."""
    old_ipg: bool = False
    """DeepSpeed 0.5.x ZeRO-3: ``backward()`` allocates the IPG buffers (one, two with overlap_comm)."""


def grad_pass(layout: StepLayout, numels: Sequence[int], spec: GradSpec) -> tuple[Segment, ...]:
    """The gradient allocations of one backward, per backward segment (plus the end).

    ZeRO-1/2's reduce buckets (``stage_1_and_2.py:setup_buckets``, at the first gradient of a
    backward that finds none ready) are freed by ``_release_ipg_buffers`` in
    ``independent_gradient_partition_epilogue``: ZeRO-2 reaches it after every backward
    (``engine.allreduce_gradients`` -> ``overlapping_partition_gradients_reduce_epilogue``), ZeRO-1
    only at the accumulation boundary (``reduce_gradients``), so a ZeRO-1 later micro-step finds
    the first one's buckets still allocated (``micro_step`` 1: none allocated; ``boundary``: freed)."""
    events: list[tuple[int, Event]] = []
    nb = spec.element_bytes
    W = spec.world
    RB = spec.reduce_bucket_size
    if spec.stage == 3:
        _zero3_grads(layout, numels, spec, events)
    elif layout.grad_order:
        first = layout.grad_segment[0]
        nbuf = 2 if spec.overlap_comm else 1
        buckets = spec.stage >= 1 and spec.contiguous_gradients
        if buckets and (spec.stage == 2 or spec.micro_step == 0):  # stage_1_and_2.py:setup_buckets
            for _ in range(nbuf):
                events.append((first, (BUCKETS, RB * nb)))
        # ZeRO-2's grads_in_partition: allocated by the first copy_grads_in_partition, when
        # reduce_ipg_grads flushes a bucket holding a param of this rank's partition (one starting
        # in the first grads_in_partition_numel elements of the flat buffer, in param order)
        gip = spec.stage == 2 and spec.contiguous_gradients and not spec.offload_optimizer
        in_part: set[int] = set()
        if gip:
            start = 0
            for p, n in enumerate(numels):
                if n and start < spec.grads_in_partition_numel:
                    in_part.add(p)
                start += n
        bucket = 0
        members: list[int] = []
        held: list[int] = []

        def flush(s: int) -> None:
            nonlocal gip
            if gip and in_part.intersection(members):
                events.append((s, (GRADS_PART, spec.grads_in_partition_numel * nb)))
                gip = False
            for b in held:  # extra-large grads die with their reduction
                events.append((s, (FULL_GRAD, -b)))

        for p, s in zip(layout.grad_order, layout.grad_segment):
            n = numels[p]
            if spec.stage <= 1:
                if spec.micro_step == 0:
                    events.append((s, (GRADS, n * nb)))  # param.grad, kept until the step
                else:  # AccumulateGrad: the new gradient, added into .grad in place
                    events.append((s, (FULL_GRAD, n * nb)))
                    events.append((s, (FULL_GRAD, -n * nb)))
                continue
            if bucket and bucket + n > RB:  # reduce_ipg_grads
                flush(s)
                held, bucket, members = [], 0, []
            events.append((s, (FULL_GRAD, n * nb)))
            if spec.contiguous_gradients and n <= RB:  # copied into the bucket, then a view of it
                events.append((s, (FULL_GRAD, -n * nb)))
            else:
                held.append(n * nb)
            bucket += n
            members.append(p)
        end = layout.n_segments
        if spec.stage >= 2:
            flush(end)  # independent_gradient_partition_epilogue -> reduce_ipg_grads
        if buckets and (spec.stage == 2 or spec.boundary):  # _release_ipg_buffers
            for _ in range(nbuf):
                events.append((end, (BUCKETS, -RB * nb)))
    segs, _ = _segments(events, layout.n_segments + 1)
    return segs


def _zero3_grads(layout: StepLayout, numels: Sequence[int], spec: GradSpec, events: list) -> None:
    """stage3.py ``reduce_independent_p_g_buckets_and_remove_grads`` / ``__add_grad_to_ipg_bucket`` /
    ``__reduce_and_partition_ipg_grads`` / ``partition_grads`` and coalesced_collectives.py
    ``reduce_scatter_coalesced`` (0.19.8)."""
    nb, W, RB = spec.element_bytes, spec.world, spec.reduce_bucket_size
    end = layout.n_segments
    if spec.old_ipg and spec.contiguous_gradients and layout.grad_order:
        first = layout.grad_segment[0]
        for _ in range(2 if spec.overlap_comm else 1):
            events.append((first, (OLD_IPG, RB * nb)))
    bucket: list[int] = []
    elems = 0
    held: list[int] = []

    def part(n: int) -> int:
        return -(-n // W)

    def flush(s: int) -> None:
        nonlocal bucket, elems, held
        if not bucket:
            return
        flat = 0
        if not (len(bucket) == 1 and bucket[0] % W == 0):
            flat = sum(part(n) for n in bucket) * W * nb
            events.append((s, (RS_FLAT, flat)))
        for n in bucket:  # partition_grads: the partition copied to the GPU (offload), fp32 at the boundary
            if spec.offload_optimizer:
                c = part(n) * spec.accum_bytes
                events.append((s, (GRAD_COPY, c)))
                if spec.boundary:
                    events.append((s, (GRAD_FP32, part(n) * 4)))
                    events.append((s, (GRAD_FP32, -part(n) * 4)))
                events.append((s, (GRAD_COPY, -c)))
        for b in held:
            events.append((s, (FULL_GRAD, -b)))
        if flat:
            events.append((s, (RS_FLAT, -flat)))
        bucket, elems, held = [], 0, []

    for p, s in zip(layout.grad_order, layout.grad_segment):
        n = numels[p]
        if bucket and elems + n > RB:
            flush(s)
        events.append((s, (FULL_GRAD, n * nb)))
        if spec.contiguous_gradients and elems + n <= RB:  # copied into the IPG bucket, then freed
            events.append((s, (FULL_GRAD, -n * nb)))
        else:
            held.append(n * nb)
        bucket.append(n)
        elems += n
    flush(end)  # independent_gradient_partition_epilogue
    if spec.old_ipg and spec.contiguous_gradients and layout.grad_order:
        for _ in range(2 if spec.overlap_comm else 1):
            events.append((end, (OLD_IPG, -RB * nb)))
