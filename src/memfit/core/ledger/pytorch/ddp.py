"""``torch.nn.parallel.DistributedDataParallel`` (torch 2.13): the gradient buckets and what a
gradient costs under them.

Mirrors ``torch/nn/parallel/distributed.py`` and ``torch/csrc/distributed/c10d/reducer.cpp``:

- construction: ``_sync_module_states`` broadcasts params and buffers from rank 0 through
  ``_broadcast_coalesced`` (``comm.cpp:broadcast_coalesced``: per dtype, buckets closed once they
  reach 250 MiB, each flattened into one tensor, at most two in flight); then the
  ``Reducer`` allocates one flat bucket tensor per bucket (``initialize_buckets``: ``at::empty`` of
  the bucket's total length, in the params' dtype) for the params that require grad (frozen params
  get none). The assignment is ``_compute_bucket_assignment_by_size`` over the params in order,
  grouped by dtype, a bucket closing once its bytes reach its limit; with ``find_unused_parameters``
  the limits are ``_DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB) for the first bucket of a dtype and
  ``bucket_cap_mb`` (25 MiB) after it (``BucketCapacityConfig.compute_bucket_size_limits``); without
  it (or with ``static_graph``) every param of a dtype goes into one bucket, which the reducer
  rebuilds at the second iteration's forward in the order gradients arrived (``_rebuild_buckets``:
  the old buckets freed, the new ones allocated; memfit takes the arrival order as the reverse
  parameter order). ``find_unused_parameters`` adds ``local_used_maps`` (int32 per param, host and
  device).
- backward: ``mark_variable_ready_dense`` copies each new gradient into its bucket view
  (``at::mul_out(bucket_view, grad, 1/W)``); with ``gradient_as_bucket_view`` the ``.grad`` is then
  made the view and the new tensor dies, otherwise ``.grad`` stays a tensor of its own (so the
  gradients are held twice). Under ``no_sync`` (the Trainer's accumulation micro-steps) gradients
  accumulate in their own tensors and reach the buckets at the last micro-step.
- ``zero_grad(set_to_none=True)`` drops the ``.grad`` tensors; the buckets stay.
"""

from __future__ import annotations

from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger.pytorch.params import TorchModel, TParam
from memfit.core.ledger.pytorch.step_context import GRAD_TMP, GRADS, GradSink
from memfit.core.ledger_types import Device
from memfit.core.scenario.types import Scenario

BUCKETS = "ddp.buckets"
BROADCAST = "ddp.broadcast_coalesced"
USED_MAPS = "ddp.local_used_maps"
FIRST_BUCKET_BYTES = 1024 * 1024
"""torch.distributed._DEFAULT_FIRST_BUCKET_BYTES."""
BROADCAST_BUCKET_BYTES = 250 * 1024 * 1024
"""distributed.py: ``self.broadcast_bucket_size = int(250 * 1024 * 1024)``."""
SRC = "torch 2.13 nn/parallel/distributed.py"


def bucket_assignment(params: list[TParam], limits: list[int]) -> list[list[TParam]]:
    """``_compute_bucket_assignment_by_size``: per dtype, params in the given order, a bucket closed
    once its bytes reach the current limit (the last limit repeats); buckets in order of their first
    param (then DDP reverses the list, which changes no size)."""
    out: list[tuple[int, list[TParam]]] = []
    open_: dict[str, tuple[list[TParam], int, int, int]] = {}  # dtype: (bucket, bytes, limit index, first's position)
    for i, p in enumerate(params):
        cur, size, li, first = open_.get(p.dtype, ([], 0, 0, i))
        if not cur:
            first = i
        cur.append(p)
        size += p.numel * p.elem_bytes
        if size >= limits[min(li, len(limits) - 1)]:
            out.append((first, cur))
            open_[p.dtype] = ([], 0, li + 1, i + 1)
        else:
            open_[p.dtype] = (cur, size, li, first)
    for cur, _, _, first in open_.values():
        if cur:
            out.append((first, cur))
    out.sort(key=lambda x: x[0])
    return [b for _, b in out]


class DdpSink(GradSink):
    """Gradients under DDP (see the module docstring)."""

    def __init__(self, sc: Scenario, m: TorchModel) -> None:
        super().__init__()
        self.sc, self.m = sc, m
        self.buckets: list[int] = []
        self.rebuilt = False

    @property
    def view(self) -> bool:
        return self.sc.ddp.gradient_as_bucket_view

    def initial_limits(self) -> list[int] | None:
        d = self.sc.ddp
        if d.static_graph or not d.find_unused_parameters:
            return None  # one bucket per dtype, rebuilt at the second iteration
        return self.rebuild_limits()

    def rebuild_limits(self) -> list[int]:
        cap = int(self.sc.ddp.bucket_cap_mb * 1024 * 1024)
        first = FIRST_BUCKET_BYTES if self.sc.ddp.bucket_cap_mb == 25.0 else cap
        return [first, cap] if first < cap else [cap]

    def alloc_buckets(self, t: Timeline, order: list[TParam], limits: list[int] | None, *, initial: bool) -> None:
        """``initial``: the wrap's buckets, which ``_ddp_init_helper`` hands the reducer in reverse
        (``list(reversed(bucket_indices))``), so the reducer allocates the last params' bucket first;
        a rebuild (``Reducer::rebuild_buckets``) keeps the arrival order it was computed in."""
        if limits is None:
            by_dtype: dict[str, int] = {}
            for p in order:
                by_dtype[p.dtype] = by_dtype.get(p.dtype, 0) + p.numel * p.elem_bytes
            self.buckets = list(by_dtype.values())
        else:
            self.buckets = [sum(p.numel * p.elem_bytes for p in b) for b in bucket_assignment(order, limits)]
        if initial:
            self.buckets.reverse()
        for n in self.buckets:
            t.alloc(BUCKETS, n)

    def on_grad(self, t: Timeline, p: TParam, first_micro: bool) -> None:
        n = p.numel * p.elem_bytes
        if not self.view:
            super().on_grad(t, p, first_micro)
            return
        if first_micro and self.last_micro:
            t.alloc(GRAD_TMP, n)  # AccumulateGrad's new .grad, copied into the bucket, replaced by the view
            t.free(GRAD_TMP, n)
        elif first_micro:
            t.alloc(GRADS, n)  # under no_sync: a tensor of its own until the last micro-step
        else:
            t.alloc(GRAD_TMP, n)
            t.free(GRAD_TMP, n)
            if self.last_micro and t.live_bytes(GRADS):
                t.free(GRADS, n)  # copied into the bucket; .grad becomes the view

    def zero_grad(self, t: Timeline, m: TorchModel) -> None:
        if t.live_bytes(GRADS):
            t.free(GRADS)

    def start_forward(self, t: Timeline, phase: str) -> None:
        """``_pre_forward``: the bucket rebuild at the first forward after a synced backward (step 2),
        and ``_sync_buffers`` (``broadcast_buffers``): the buffers flattened for a broadcast."""
        if phase == "step2.forward" and not self.rebuilt and self.initial_limits() is None:
            self.rebuilt = True
            t.free(BUCKETS)
            self.alloc_buckets(t, [p for p in reversed(self.m.params) if p.trainable], self.rebuild_limits(), initial=False)
        if self.sc.ddp.broadcast_buffers and self.sc.model.buffer_bytes:
            t.alloc(BROADCAST, self.sc.model.buffer_bytes)
            t.free(BROADCAST, self.sc.model.buffer_bytes)


def record_ddp_wrap(t: Timeline, sink: DdpSink) -> None:
    """``DistributedDataParallel(model)``: the broadcast of params and buffers, then the buckets."""
    sc, m = sink.sc, sink.m
    tr = [p for p in m.params if p.trainable]
    d = sc.ddp
    t.declare(BROADCAST, name="flat buffers of _broadcast_coalesced (params and buffers from rank 0)",
              device=Device.GPU, category="buffers",
              formula="buckets of 250 MiB per dtype, two in flight",
              source=f"{SRC}:_sync_module_states -> torch.distributed.utils._sync_params_and_buffers")
    # broadcast_coalesced (csrc/distributed/c10d/comm.cpp): buckets of up to 250 MiB per dtype, closed once
    # they reach it, each flattened into one tensor; at most two in flight (the older one finished and
    # freed before a third is made)
    states = [(p.dtype if not p.quantized else "q", p.nbytes) for p in m.params] + \
        [(b.dtype, b.nbytes) for b in sc.model.buffers]
    flats: list[int] = []
    open_: dict[str, int] = {}
    for dtype, n in states:
        cur = open_.get(dtype, 0) + n
        if cur >= BROADCAST_BUCKET_BYTES:
            flats.append(cur)
            cur = 0
        open_[dtype] = cur
    flats += [n for n in open_.values() if n]
    in_flight: list[int] = []
    for n in flats:
        if len(in_flight) >= 2:
            t.free(BROADCAST, in_flight.pop(0))
        t.alloc(BROADCAST, n)
        in_flight.append(n)
    t.free(BROADCAST)
    total = sum(p.numel * p.elem_bytes for p in tr)
    lim = sink.initial_limits()
    t.declare(BUCKETS, name="DDP gradient buckets (flat, one per bucket)", device=Device.GPU, category="grads",
              formula=(f"{total:,} B of trained params' gradients"
                       + (" in one bucket per dtype until the second iteration rebuilds them" if lim is None else "")
                       + f"; buckets of {d.bucket_cap_mb:g} MiB (the first 1 MiB)"
                       + ("; .grad tensors are views into them" if d.gradient_as_bucket_view
                          else "; .grad tensors are separate (held twice)")),
              source="torch 2.13 csrc/distributed/c10d/reducer.cpp:initialize_buckets; "
                     f"{SRC}:_ddp_init_helper (_compute_bucket_assignment_by_size)")
    if d.find_unused_parameters and not d.static_graph:
        t.declare(USED_MAPS, name="local_used_maps (int32 per trained param, host and device)", device=Device.GPU,
                  category="buffers", formula=f"{len(tr)} x 4 B x 2",
                  source="torch 2.13 reducer.cpp:initialize_local_used_map")
    if not tr:
        return
    sink.alloc_buckets(t, tr, lim, initial=True)
    if d.find_unused_parameters and not d.static_graph:
        t.alloc(USED_MAPS, 4 * len(tr))
        t.alloc(USED_MAPS, 4 * len(tr))

