"""ZeRO-3 GPU memory inside a training step, replayed over a traced module order (pure Python).

DeepSpeed 0.19.8 gathers each module's parameters in its forward (and backward) pre-hook and
releases them in the post-hook; this module replays those rules over the order in which the traced
step ran its modules, adds the activation-side bytes the trace measured at each point, and
models the gradient path, to find the step's highest GPU bytes and the module where it happens.

The parameter side is ``memfit.core.ledger.deepspeed.zero3_fetch.Coordinator``, the same simulation of
deepspeed/runtime/zero/partitioned_param_coordinator.py the ledger runs over its module order (see
its docstring for the rules: fetch, prefetch, release, reuse distance, coalesced all-gather
buffers), here driven by the traced hook order. Persistent params
(``parameter_offload.py:mark_persistent_parameters``) stay whole on every rank; the ledger counts
them elsewhere, so their bytes are left out here.
- Gradients (deepspeed/runtime/zero/stage3.py ``reduce_independent_p_g_buckets_and_remove_grads``,
  ``__add_grad_to_ipg_bucket``, ``__reduce_and_partition_ipg_grads``, ``partition_grads``): a
  param's full gradient exists as soon as autograd accumulates it; if the reduce bucket would
  overflow, the bucket is reduce-scattered first (runtime/comm/coalesced_collectives.py
  ``reduce_scatter_coalesced`` concatenates the padded partitions into a new flat tensor unless it
  holds one param divisible by W); then the gradient is copied into the preallocated bucket and
  freed, or, if it does not fit (``contiguous_gradients`` off or ``p > reduce_bucket_size``), kept
  until the next reduce. With the optimizer offloaded, ``partition_grads`` copies each partition
  back to the GPU (``grad_buffer.to(grad_partition.device)``).

The reduce bucket itself (allocated at initialize), the gradient partitions and the param
partitions are model states the ledger counts; the items here are what a step adds on top.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memfit.core.frameworks.deepspeed import DeepSpeedSettings
from memfit.core.ledger.deepspeed.zero3_fetch import AG_STAGING, Coordinator, GParam, persistent_flags
from memfit.core.ledger_types import Device, LedgerItem
from memfit.errors import MemfitError
from memfit.trace.results import TraceResult

PCO = "deepspeed/runtime/zero/partitioned_param_coordinator.py"
_GRAD_ACCUM_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


@dataclass(frozen=True, slots=True, kw_only=True)
class Zero3StepPeak:
    """The highest GPU bytes a ZeRO-3 step adds to the model states, and where it happens."""

    peak_bytes: int
    """Sum of ``items``: activations + gathered params + gradient transients, per rank."""
    phase: str
    """``forward`` or ``backward``."""
    module: str
    """The module running at the peak (``named_modules`` name)."""
    moment: str
    """``compute`` (between hooks), ``gather`` (waiting for an all-gather), ``reduce`` (a gradient
    bucket being reduce-scattered)."""
    items: tuple[LedgerItem, ...]
    max_gathered_bytes: int
    """Highest gathered-parameter bytes (whole params + in-flight all-gather buffers) at any point
    of the step, wherever the overall peak is."""
    max_gathered_module: str
    """The module being fetched when ``max_gathered_bytes`` is reached."""
    max_gradient_bytes: int
    """Highest bytes of full gradients waiting for (or in) a reduce-scatter, wherever the peak is."""
    first_step_peak_bytes: int
    """The same peak for the first step, which records the module trace and neither prefetches nor
    keeps params for reuse (``ZeRoTraceMode.RECORD``)."""
    notes: tuple[str, ...] = ()


def zero3_step_memory(trace: TraceResult, ds: DeepSpeedSettings, world_size: int) -> Zero3StepPeak:
    """Replay ZeRO-3's fetch/release and gradient bucketing over ``trace`` for ``world_size`` ranks."""
    if world_size < 1:
        raise MemfitError(f"world size must be >= 1, got {world_size}")
    if ds.zero.stage != 3:
        raise MemfitError(f"zero3_step_memory needs ZeRO stage 3, got stage {ds.zero.stage}")
    replay = _Replay(trace, ds, world_size, complete_trace=True)
    steady = replay.run()
    first = _Replay(trace, ds, world_size, complete_trace=False).run()
    notes = []
    if trace.options.zero3_linear != ds.zero.memory_efficient_linear:
        notes.append(
            f"trace ran with zero3_linear={trace.options.zero3_linear} but memory_efficient_linear="
            f"{ds.zero.memory_efficient_linear}: activations of frozen Linear layers differ"
        )
    if not ds.zero.memory_efficient_linear:
        notes.append("memory_efficient_linear off: autograd keeps views of gathered weights until backward (not modelled)")
    return Zero3StepPeak(
        peak_bytes=steady.total,
        phase=steady.phase,
        module=steady.module,
        moment=steady.moment,
        items=steady.items(ds),
        max_gathered_bytes=replay.max_gathered,
        max_gathered_module=replay.max_gathered_module,
        max_gradient_bytes=replay.max_grads,
        first_step_peak_bytes=first.total,
        notes=tuple(notes),
    )


@dataclass(slots=True)
class _Peak:
    total: int = -1
    act: int = 0
    gathered: int = 0
    gathered_params: int = 0
    inflight: int = 0
    grads: int = 0
    phase: str = "forward"
    module: str = ""
    moment: str = "compute"

    def items(self, ds: DeepSpeedSettings) -> tuple[LedgerItem, ...]:
        z = ds.zero
        at = f"at {self.module or '<root>'} ({self.phase}, {self.moment})"
        return (
            LedgerItem(
                key="step.activations",
                name="activations, saved tensors and temporaries (traced)",
                device=Device.GPU,
                bytes=self.act,
                formula=f"traced live bytes {at}: saved for backward + outputs + temporaries + inputs",
                source="memfit.trace (FakeTensorMode trace of the model's forward/backward)",
                category="activations",
                exact=True,
            ),
            LedgerItem(
                key="zero3.gathered_params",
                name="params gathered for the running modules, prefetched and kept for reuse",
                device=Device.GPU,
                bytes=self.gathered + self.inflight,
                formula=(
                    f"{self.gathered_params} gathered params = {self.gathered:,} B + in-flight all-gather buffers "
                    f"{self.inflight:,} B {at}; prefetch_bucket {z.prefetch_bucket_size:,}, max_live "
                    f"{z.max_live_parameters:,}, max_reuse_distance {z.max_reuse_distance:,} elements"
                ),
                source=f"{PCO}:fetch_sub_module/release_sub_module; partition_parameters.py:_all_gather_dtype",
                category="params",
                exact=False,
            ),
            LedgerItem(
                key="step.full_gradient",
                name="full gradients before reduce-scatter and reduce temporaries",
                device=Device.GPU,
                bytes=self.grads,
                formula=f"gradients not yet in the reduce bucket + reduce-scatter flat copy {at}; "
                f"reduce_bucket {z.reduce_bucket_size:,} elements",
                source="deepspeed/runtime/zero/stage3.py:reduce_independent_p_g_buckets_and_remove_grads, "
                "runtime/comm/coalesced_collectives.py:reduce_scatter_coalesced",
                category="grads",
                exact=False,
            ),
        )


class _StagingSink:
    """Tracks the coordinator's GPU copies of offloaded partitions (the rest it counts itself)."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0

    def alloc(self, key: str, nbytes: int) -> None:
        if key == AG_STAGING:
            self.live += nbytes
            self.peak = max(self.peak, self.live)

    def free(self, key: str, nbytes: int) -> None:
        if key == AG_STAGING:
            self.live -= nbytes


class _Replay:
    """One step of ZeRO-3 over the traced events; ``run`` returns the peak. The coordinator is
    ``memfit.core.ledger.deepspeed.zero3_fetch.Coordinator`` (the ledger's), driven by the traced order."""

    def __init__(self, trace: TraceResult, ds: DeepSpeedSettings, world: int, *, complete_trace: bool) -> None:
        self.trace = trace
        self.z = ds.zero
        self.W = world
        self.complete = complete_trace
        self.params = trace.params
        self.offload_param = self.z.offload_param.device != "none"
        self.offload_opt = self.z.offload_optimizer.device != "none"
        default = self.params[0].element_bytes if self.params else 2  # DeepSpeed: the training dtype
        self.accum_bytes = _GRAD_ACCUM_BYTES.get(ds.grad_accum_dtype or "", default)
        flags = persistent_flags([p.numel for p in self.params], self.z.param_persistence_threshold,
                                 self.z.model_persistence_threshold)
        gparams = [GParam(p.numel, p.element_bytes, f) for p, f in zip(self.params, flags)]
        # recorded order: every module fetch (forward and backward pre-hooks)
        self.order = [e.module for e in trace.events if e.kind in ("fwd_pre", "bwd_pre")]
        self.sink = _StagingSink()
        # persistent params are whole on every rank from the start; the ledger counts them
        self.co = Coordinator(gparams, [m.params for m in trace.modules], world,
                              prefetch_bucket_size=self.z.prefetch_bucket_size,
                              max_live_parameters=self.z.max_live_parameters,
                              max_reuse_distance=self.z.max_reuse_distance, offload_param=self.offload_param,
                              allgather_sequential=self.z.allgather_sequential,
                              order=self.order if complete_trace else None, persistent_available=True,
                              sink=self.sink)
        self.pending_grads = 0
        self.pending_grad_params: list[int] = []
        self.bucket_elems = 0
        self.bucket_params: list[int] = []
        self.peak = _Peak()
        self.max_gathered = 0
        self.max_grads = 0
        self.max_gathered_module = ""

    # ------------------------------------------------------------------ helpers
    def _part(self, i: int) -> int:
        return math.ceil(self.params[i].numel / self.W)

    def _eb(self, i: int) -> int:
        return self.params[i].element_bytes

    @property
    def gathered(self) -> int:
        return self.co.gathered_bytes

    @property
    def inflight(self) -> int:
        return self.co.flat_bytes + self.sink.live

    def _state(self) -> int:
        return self.gathered + self.inflight + self.pending_grads

    def _note(self, act: int, extra: int, grads_extra: int, phase: str, module: str, moment: str) -> None:
        total = act + self._state() + extra + grads_extra
        self.max_grads = max(self.max_grads, self.pending_grads + grads_extra)
        if total > self.peak.total:
            self.peak = _Peak(
                total=total, act=act, gathered=self.gathered, inflight=self.inflight + extra,
                gathered_params=sum(1 for b in self.co.data if b) - sum(
                    1 for i, b in enumerate(self.co.data) if b and self.co.p[i].persist),
                grads=self.pending_grads + grads_extra, phase=phase, module=module, moment=moment,
            )

    # ------------------------------------------------------------------ DeepSpeed hooks
    def fetch(self, m: int, forward: bool) -> int:
        """``fetch_sub_module``; returns the momentary bytes of the partition copies made during it."""
        self.sink.peak = self.sink.live
        self.co.fetch(m, forward)
        return self.sink.peak - self.sink.live

    def release(self, m: int) -> None:
        self.co.release(m)

    def grad_ready(self, p: int) -> int:
        """A full gradient of ``p`` was accumulated; returns the gradient bytes alive meanwhile that
        the state does not hold (the new gradient, and a bucket being reduced)."""
        numel, eb = self.params[p].numel, self._eb(p)
        momentary = 0
        if self.bucket_params and self.bucket_elems + numel > self.z.reduce_bucket_size:
            momentary += self._reduce()
        if self.z.contiguous_gradients and self.bucket_elems + numel <= self.z.reduce_bucket_size:
            momentary += numel * eb  # alive until copied into the preallocated bucket, then freed
        else:
            self.pending_grads += numel * eb  # kept as param.grad until the next reduce
            self.pending_grad_params.append(p)
        self.bucket_params.append(p)
        self.bucket_elems += numel
        return momentary

    def _reduce(self) -> int:
        """Reduce-scatter the bucket; returns the bytes alive during it that the state drops after
        (the flat copy, the GPU copy of a partition for an offloaded optimizer, the pending grads)."""
        params = self.bucket_params
        tmp = 0
        if not (len(params) == 1 and self.params[params[0]].numel % self.W == 0):
            tmp += sum(self._part(p) for p in params) * self.W * self._eb(params[0])
        if self.offload_opt:
            tmp += max(self._part(p) for p in params) * self.accum_bytes
        tmp += self.pending_grads
        self.pending_grads = 0
        self.pending_grad_params = []
        self.bucket_params = []
        self.bucket_elems = 0
        return tmp

    # ------------------------------------------------------------------ replay
    def run(self) -> _Peak:
        names = [m.name for m in self.trace.modules]
        stack: list[int] = []
        phase = "forward"
        for e in self.trace.events:
            where = names[stack[-1]] if stack else ""
            self._note(e.act_peak_bytes, 0, 0, phase, where, "compute")  # the segment that ends here
            if e.kind in ("fwd_pre", "bwd_pre"):
                stack.append(e.module)
                extra = self.fetch(e.module, e.kind == "fwd_pre")
                self._note(e.act_bytes, extra, 0, phase, names[e.module], "gather")
                if self.gathered + self.inflight + extra > self.max_gathered:
                    self.max_gathered = self.gathered + self.inflight + extra
                    self.max_gathered_module = names[e.module]
            elif e.kind in ("fwd_post", "bwd_post"):
                self.release(e.module)
                if stack and stack[-1] == e.module:
                    stack.pop()
                elif e.module in stack:
                    stack.remove(e.module)
            elif e.kind == "grad":
                self._note(e.act_bytes, 0, self.grad_ready(e.param), phase, where, "reduce")
            elif e.kind == "end_forward":
                phase = "backward"
            elif e.kind == "end_backward" and self.bucket_params:
                self._note(e.act_bytes, 0, self._reduce(), phase, where, "reduce")
        return self.peak
