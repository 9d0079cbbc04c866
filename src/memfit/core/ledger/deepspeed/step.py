"""Training steps after initialize: step 1, its later micro-steps, the steady state, and saving.

Phases (``memfit.core.ledger_types.PHASES``): ``forward``/``backward`` (micro-step 1 of step 1),
``accum.forward``/``accum.backward`` (a later micro-step of step 1, only with
gradient_accumulation_steps > 1), ``optimizer_step`` (the end of step 1), ``step2.forward``/
``step2.backward``/``step2.optimizer_step`` (the steady state: step 2 on, the worst micro-step when
accumulating), ``save``. What each adds on top of the model states initialize left:

- activations, one set per transformer block (``memfit.core.activations.analytic``, analytic; ``memfit plan
  --exact`` uses the traced figure), freed block by block in backward; with gradient checkpointing
  a block's activations are rebuilt during its backward (``recompute_bytes``); the logits and the
  loss's tensors as transformers' loss code makes them (``step_activations``: the fp32 copy of the
  logits and the saved log-softmax at the forward's end, their gradients when backward starts);
  encoder-decoders' decoder blocks at ``target_len`` tokens;
- ZeRO-3: parameters gathered per module by the coordinator (``zero3_fetch``) over the module order
  (``module_order``): the first micro-step records the trace (no prefetch, every param released
  after its module); from the next micro-step on the trace is complete (prefetch, reuse distance,
  persistent params kept); ``stage3.py:step`` releases every gathered param first, the persistent
  ones too (``_partition_all_parameters``), and ``_post_step`` gathers the persistent ones again;
- gradients per parameter (``step_segments.grad_pass``): ZeRO-3's IPG bucket and reduce-scatter
  flat copy and, with the optimizer offloaded, the partition's GPU copies; ZeRO-1/2's reduce
  buckets (allocated at the first gradient of a backward; ZeRO-1 keeps them to the accumulation
  boundary), ZeRO-2's ``grads_in_partition`` (at the first bucket flush holding its params);
  stages 0/1 keep full gradients until the step;
- between micro-steps (gradient accumulation): stages 0/1 keep the full gradients, ZeRO-2 its
  accumulated partition (``all_grad_tensors``), DeepSpeed 0.5.x ZeRO-3 its ``grads_in_partition``;
  0.19's ZeRO-3 accumulates into the gradient partitions allocated at initialize;
- the optimizer states, created at the first ``step()`` (0.19; earlier versions at initialize),
  alive from then on: the steady state holds them together with activations and gathered params;
- save: ``engine.py:_zero3_consolidated_16bit_state_dict`` gathers one module at a time and copies
  every param to host memory on rank 0.
Items not fixed by the code alone (activations, gathered params at a given instant) say so
(``exact=False``).
"""

from __future__ import annotations

from collections.abc import Sequence

from memfit.core.activations.adapters import AdapterActivations, Quantization, adapter_activations, quantized_layers
from memfit.core.ledger.deepspeed.quant import declare_dequant, record_dequant
from memfit.core.precision import DTYPE_BYTES
from memfit.core.quant_kernels import bnb_release
from memfit.core.activations.analytic import ActivationEstimate, estimate_activation_bytes
from memfit.core.activations.tensors import ActivationTensors, split_estimate
from memfit.core.ledger import host_process
from memfit.core.ledger.context import DTYPE_BYTES, RecipeContext, ceil_div, optimizer_offload
from memfit.core.ledger.deepspeed.module_order import flow_flags
from memfit.core.ledger.deepspeed.step_activations import ACT, RECOMPUTE, ActivationPlan, apply, declare_activations
from memfit.core.ledger.deepspeed.step_segments import (BUCKETS, FULL_GRAD, GRAD_COPY, GRAD_FP32, GRADS, GRADS_PART, OLD_IPG,
                                              RS_FLAT, GatherPass, GradSpec, Segment, StepLayout, build_layout,
                                              gather_pass, grad_pass)
from memfit.core.ledger.deepspeed.streams import zero3_streams
from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger.deepspeed.zero012 import grads_in_partition_numel
from memfit.core.ledger.deepspeed.zero3 import OPT_STATES, declare_states, host, optimized_params
from memfit.core.ledger.deepspeed.zero3_fetch import (AG_FLAT, AG_STAGING, GATHERED, P30, PCO, PERSISTENT, GParam,
                                            persistent_flags, upper_bound_numel)
from memfit.core.ledger_types import Device, LedgerItem, TracedStep

PERSIST_FULL = PERSISTENT
GRAD_FULL = FULL_GRAD
STEP_TMP = "step.fp32_grad_tmp"
STEP_FLAT = "step.flat_grad_tmp"
STEP_NORM = "step.grad_norm_fp64"
OLD_GRADS_PART = "zero3.grads_in_partition"
SAVE_HOST = "save.state_dict"
SAVE_GPU = "save.gathered_module"
S3 = "deepspeed/runtime/zero/stage3.py"
S12 = "deepspeed/runtime/zero/stage_1_and_2.py"


def _modules(ctx: RecipeContext) -> dict[str, int]:
    """Elements per module (params directly owned, as ZeRO-3 fetches them)."""
    out: dict[str, int] = {}
    for p in ctx.params:
        mod = p.name.rsplit(".", 1)[0] if "." in p.name else ""
        out[mod] = out.get(mod, 0) + p.numel
    return out


def deepspeed_adapters(sc, model_bytes: int) -> AdapterActivations | None:  # noqa: ANN001 (Scenario)
    """The PEFT adapters' saved tensors as DeepSpeed runs them: the engine casts every parameter,
    adapters included, to the training dtype (``_cast_module_mixed_precision``); peft upcast the
    adapters first when the model was loaded in 16 bits (``autocast_adapter_dtype``); a 4-bit base's
    matmuls as its bitsandbytes release runs them."""
    quant = None
    if sc.quant.enabled:
        from memfit.core.quant import quantized_weights

        modules = {n.rsplit(".", 1)[0].replace(".base_layer", "").removeprefix("base_model.model.")
                   for n in quantized_weights(sc.model.params, sc.quant, sc.model.arch.model_type)}
        quant = Quantization(method=sc.quant.method, compute_bytes=DTYPE_BYTES[sc.quant.compute_dtype],
                             release=bnb_release(sc.runtime.bitsandbytes_version),
                             layers=quantized_layers(sc.model, modules))
    return adapter_activations(sc.model, sc.peft, adapter_bytes=model_bytes, base_bytes=model_bytes,
                               upcast=sc.load.dtype in ("fp16", "bf16"), quantized=quant)


def activation_estimate(ctx: RecipeContext) -> ActivationEstimate:
    sc = ctx.scenario
    z = sc.deepspeed.zero
    return estimate_activation_bytes(sc.model.arch, sc.peft, seq_len=sc.train.seq_len,
                                     micro_batch=sc.train.micro_batch, dtype_bytes=ctx.model_bytes,
                                     gradient_checkpointing=sc.train.gradient_checkpointing,
                                     attention=sc.train.attention, target_len=sc.train.target_len,
                                     # ZeRO-3's memory-efficient Linear saves every Linear's input
                                     linear_saves_frozen_inputs=z.stage == 3 and z.memory_efficient_linear,
                                     adapters=deepspeed_adapters(sc, ctx.model_bytes), kernels=sc.accelerator,
                                     float16=sc.deepspeed.precision == "fp16")  # the engine's module.half()


def activation_tensors(ctx: RecipeContext, est: ActivationEstimate) -> ActivationTensors:
    """``est`` as tensors (``memfit.core.activations.tensors``), one allocator request each."""
    sc = ctx.scenario
    z = sc.deepspeed.zero
    return split_estimate(est, sc.model.arch, sc.peft, seq_len=sc.train.seq_len, micro_batch=sc.train.micro_batch,
                          dtype_bytes=ctx.model_bytes, gradient_checkpointing=sc.train.gradient_checkpointing,
                          attention=sc.train.attention, target_len=sc.train.target_len,
                          linear_saves_frozen_inputs=z.stage == 3 and z.memory_efficient_linear, kernels=sc.accelerator,
                          float16=sc.deepspeed.precision == "fp16")


def step_layout(ctx: RecipeContext) -> StepLayout:
    sc = ctx.scenario
    arch = sc.model.arch
    return build_layout([p.name for p in ctx.params], [p.numel for p in ctx.params], [p.trainable for p in ctx.params],
                        num_layers=arch.num_layers + arch.num_encoder_layers,
                        checkpointing=sc.train.gradient_checkpointing, **flow_flags(arch, sc.peft.method))


class _Step:
    """The step recipe (see the module docstring); ``run`` records every phase."""

    def __init__(self, t: Timeline, ctx: RecipeContext, opt_numel: int, traced: TracedStep | None,
                 elem_bytes: Sequence[int] | None, groups: Sequence[int] | None = None) -> None:
        sc = ctx.scenario
        self.t, self.ctx, self.sc = t, ctx, sc
        self.ds = sc.deepspeed
        self.z = self.ds.zero
        self.W = ctx.world
        self.nb = ctx.model_bytes
        self.stage3 = self.z.stage == 3
        self.ga = max(self.ds.gradient_accumulation_steps, 1)
        self.opt = optimized_params(ctx)
        self.opt_numel = opt_numel
        grad_names = {p.name for p in ctx.trainable}
        self.gip_numel = grads_in_partition_numel([p.numel for p in self.opt], opt_numel,
                                                  [p.name in grad_names for p in self.opt])
        """ZeRO-2's ``grads_in_partition``: the params of rank 0's partition, whole."""
        self.groups = tuple(groups) if groups else (opt_numel,)
        self.off = optimizer_offload(self.z.stage, self.z.offload_optimizer.device) != "none"
        self.traced = traced
        self.ckpt = sc.train.gradient_checkpointing
        self.layout = step_layout(ctx)
        self.est = activation_estimate(ctx)
        arch = sc.model.arch
        self.num_layers = arch.num_layers + arch.num_encoder_layers
        self.acts = ActivationPlan(self.est, self.layout.blocks, self.layout.n_segments, self.nb, self.ckpt,
                                   self.num_layers, activation_tensors(ctx, self.est))
        self.eb = list(elem_bytes) if elem_bytes is not None else [self.nb] * len(ctx.params)
        numels = [p.numel for p in ctx.params]
        self.numels = numels
        if self.stage3:
            flags = persistent_flags(numels, self.z.param_persistence_threshold, self.z.model_persistence_threshold,
                                     inclusive=sc.ds_version == "0.19")
            self.gparams = [GParam(n, e, f) for n, e, f in zip(numels, self.eb, flags)]
            self.persist_bytes = [0] * len(numels)  # each persistent param's gathered bytes
        self.trained = {p.name for p in self.opt if p.trainable}
        """Params that get a gradient: the optimized ones with requires_grad (DeepSpeed 0.5/0.6 also
        optimize frozen params passed to it, which autograd never gives a .grad)."""
        self._passes: dict[tuple[bool, bool], GatherPass] = {}

    # ------------------------------------------------------------------ helpers
    def gather(self, complete: bool, persistent_available: bool) -> GatherPass:
        key = (complete, persistent_available)
        if key not in self._passes:
            self._passes[key] = self._gather(complete, persistent_available)
        return self._passes[key]

    def _gather(self, complete: bool, persistent_available: bool) -> GatherPass:
        z = self.z
        return gather_pass(self.layout, self.gparams, self.W, prefetch_bucket_size=z.prefetch_bucket_size,
                           max_live_parameters=z.max_live_parameters, max_reuse_distance=z.max_reuse_distance,
                           # .to(device) of an offloaded partition copies it to the GPU; on the CPU
                           # accelerator the "device" is the host and .to() returns the same tensor
                           offload_param=z.offload_param.device != "none" and self.t.accelerator == "cuda",
                           allgather_sequential=z.allgather_sequential, complete=complete,
                           persistent_available=persistent_available)

    def grads(self, *, micro: int, boundary: bool) -> tuple[Segment, ...]:
        z = self.z
        ga_bytes = self.ctx.grad_accum_bytes
        spec = GradSpec(stage=z.stage, world=self.W, element_bytes=self.nb, accum_bytes=ga_bytes,
                        reduce_bucket_size=z.reduce_bucket_size, contiguous_gradients=z.contiguous_gradients,
                        overlap_comm=bool(z.overlap_comm), offload_optimizer=self.off, boundary=boundary,
                        micro_step=micro, grads_in_partition_numel=self.gip_numel,
                        old_ipg=self.sc.ds_version == "0.5")
        numels = [p.numel if p.name in self.trained else 0 for p in self.ctx.params]
        return grad_pass(self.layout, numels, spec)

    def apply(self, events) -> None:
        apply(self.t, events)

    # ------------------------------------------------------------------ declarations
    def declare(self) -> None:
        declare_dequant(self.t, self.ctx)
        t, z, nb, W = self.t, self.z, self.nb, self.W
        est = self.est
        declare_activations(t, est, checkpointing=self.ckpt,
                            source="memfit.core.activations.analytic (use `memfit plan --exact` or `memfit trace` for the traced figure)")
        t.declare(GRAD_FULL, name="full gradient of a trained param before DeepSpeed takes it", device=Device.GPU,
                  category="grads", formula=f"p x {nb} B per param, until copied into the reduce bucket (or reduced)",
                  source=(f"{S3}:reduce_independent_p_g_buckets_and_remove_grads (__add_grad_to_ipg_bucket)"
                          if self.stage3 else f"{S12}:reduce_independent_p_g_buckets_and_remove_grads; torch AccumulateGrad"))
        if self.stage3:
            self._declare_zero3()
        else:
            t.declare(GRADS, name="full gradients of the trained params (param.grad), kept until the step",
                      device=Device.GPU, category="grads", formula=f"p x {nb} B per trained param",
                      source="torch autograd (param.grad); the optimizer reads them at step()")
            nbuf = 2 if z.overlap_comm else 1
            when = "at every backward" if z.stage != 1 else "at the first backward of each step (kept until the boundary)"
            t.declare(BUCKETS, name=f"gradient reduce bucket(s) x{nbuf}, allocated {when}",
                      device=Device.GPU, category="buffers",
                      formula=f"{nbuf} x reduce_bucket_size {z.reduce_bucket_size:,} x {nb} B",
                      source=f"{S12}:setup_buckets (freed by _release_ipg_buffers in independent_gradient_partition_"
                             "epilogue: every backward for ZeRO-2, at the accumulation boundary for ZeRO-1)")
            t.declare(GRADS_PART, name="gradient partition (grads_in_partition), accumulated until the step",
                      device=Device.GPU, category="grads",
                      formula=f"{self.gip_numel:,} x {nb} B: the params of this rank's {self.opt_numel:,}-element "
                              "partition, whole (one straddling its end counts in full)",
                      source=f"{S12}:copy_grads_in_partition (sum of params_in_partition numel); kept as "
                             "all_grad_tensors/averaged_gradients until step()'s free_grad_in_param_list")
        t.declare(STEP_TMP, name="fp32 copy of this rank's gradient for the step", device=Device.GPU, category="grads",
                  formula=f"{self.opt_numel:,} x 4 B (per sub group)",
                  source="stage3.py:_prepare_fp32_grad_for_sub_group / stage_1_and_2.py:step (.to(fp32))")
        fb = self.ctx.grad_accum_bytes if self.stage3 else nb
        t.declare(STEP_FLAT, name="flattened gradient partition before its fp32 copy", device=Device.GPU,
                  category="grads", formula=f"{self.opt_numel:,} x {fb} B (per sub group), dropped once copied",
                  source="stage3.py:_prepare_fp32_grad_for_sub_group / stage_1_and_2.py:step (self.flatten(averaged_gradients))")

    def _declare_zero3(self) -> None:
        t, z, nb, W = self.t, self.z, self.nb, self.W
        ctx = self.ctx
        persist = [i for i, g in enumerate(self.gparams) if g.persist]
        persist_elems = sum(ceil_div(self.numels[i], W) * W for i in persist)
        t.declare(PERSIST_FULL, name=f"persistent params (p <= {z.param_persistence_threshold:,}) gathered and kept",
                  device=Device.GPU, category="params",
                  formula=f"{len(persist)} params, sum of ceil(p/W) x W = {persist_elems:,} elements x {nb} B once "
                          "gathered (released like any other while the first step records its trace)",
                  source="deepspeed/runtime/zero/parameter_offload.py:mark_persistent_parameters; stage3.py:_post_step")
        rec = self.gather(False, False)
        comp = self.gather(True, True)
        exp_rec = max(s.top for s in rec.forward + rec.backward)
        exp_comp = max(s.top for s in comp.forward + comp.backward)
        mods = _modules(ctx)
        aligned = sum(ceil_div(n, W) * W for n, g in zip(self.numels, self.gparams) if not g.persist)
        bound = upper_bound_numel(chain_numel=self.layout.order.chain_max, largest_module=max(mods.values()),
                                  largest_param=max(self.numels), total_numel=aligned,
                                  prefetch_bucket_size=z.prefetch_bucket_size,
                                  max_live_parameters=z.max_live_parameters, max_reuse_distance=z.max_reuse_distance)
        self.gather_expected = (exp_rec, exp_comp)
        self.gather_bound_bytes = bound * max(self.eb)
        t.declare(GATHERED, name="params gathered by ZeRO-3 for the running modules, prefetched or kept for reuse",
                  device=Device.GPU, category="params", exact=False,
                  formula=(f"per param ceil(p/W) x W x B (own buffer) or p x B (copied out of a coalesced gather); "
                           f"coordinator simulated over the module order: highest {exp_rec:,} B in step 1 (recording "
                           f"the trace), {exp_comp:,} B later (prefetch_bucket {z.prefetch_bucket_size:,}, max_live "
                           f"{z.max_live_parameters:,}, max_reuse_distance {z.max_reuse_distance:,} elements); "
                           f"bound from the rules {self.gather_bound_bytes:,} B with the flat buffers"),
                  source=f"{PCO}:fetch_sub_module/release_sub_module; {P30}:all_gather_coalesced")
        t.declare(AG_FLAT, name="coalesced all-gather output buffers in flight", device=Device.GPU, category="params",
                  exact=False, formula="sum ceil(p/W) x W x B per gather, until its last param is fetched",
                  source=f"{P30}:_all_gather_dtype (flat_tensor); {PCO}:__inflight_param_registry")
        t.declare(AG_STAGING, name="offloaded partitions copied to the GPU for the all-gather", device=Device.GPU,
                  category="params", exact=False, formula="ceil(p/W) x B per param being gathered",
                  source=f"{P30}:_all_gather_dtype / _all_gather_sequential (p.ds_tensor.to(device))")
        t.declare(RS_FLAT, name="reduce-scatter flat copy of a gradient bucket", device=Device.GPU, category="grads",
                  formula=f"sum ceil(p/W) x W x {nb} B per bucket flush (none for one param divisible by W)",
                  source="deepspeed/runtime/comm/coalesced_collectives.py:reduce_scatter_coalesced (torch.cat)")
        ga = self.ctx.grad_accum_bytes
        t.declare(GRAD_COPY, name="gradient partition copied to the GPU (optimizer offloaded)", device=Device.GPU,
                  category="grads", formula=f"ceil(p/W) x {ga} B, one param at a time",
                  source=f"{S3}:partition_grads (grad_buffer.to(grad_partition.device))")
        t.declare(GRAD_FP32, name="fp32 copy of a gradient partition on its way to the host", device=Device.GPU,
                  category="grads", formula="ceil(p/W) x 4 B, one param at a time, at the accumulation boundary",
                  source=f"{S3}:_offload_grad_partition_at_boundary (grad_buffer.to(dtype=fp32))")
        if self.sc.ds_version == "0.5":
            nbuf = 2 if z.overlap_comm else 1
            t.declare(OLD_IPG, name=f"IPG reduce buffer(s) x{nbuf}, allocated at every backward", device=Device.GPU,
                      category="buffers", formula=f"{nbuf} x reduce_bucket_size {z.reduce_bucket_size:,} x {nb} B",
                      source=f"{S3}:backward (v0.5.10 lines 2929-2941: buf_0, buf_1 if overlap_comm)")
            off = self.off
            pinned = z.offload_param.pin_memory
            t.declare(OLD_GRADS_PART, name="reduced gradient partitions (grads_in_partition)",
                      device=host(pinned) if off else Device.GPU, category="grads",
                      formula=f"{self.opt_numel:,} elements x {nb} B",
                      source=f"{S3}:partition_previous_reduced_grads (v0.5.10 lines 2053-2085)")

    # ------------------------------------------------------------------ phases
    def run(self) -> None:
        t = self.t
        self.declare()
        stage3 = self.stage3
        ga = self.ga
        t.phase("forward", "forward pass (step 1, first micro-step): activations saved for backward"
                + (", params gathered per module while ZeRO-3 records its trace" if stage3 else ""))
        workers = host_process.worker_part(self.sc.train.dataloader_workers, self.sc.train.dataset_tokens)
        if workers is not None:  # the training loop's first iter(dataloader) forks them
            host_process.record(t, [workers])
        host_process.record_pinned_batches(t, self.sc)
        self.pass_(complete=False, persistent_available=False, micro=0, boundary=ga == 1, prefix="")
        if ga > 1:
            t.phase("accum.forward", f"forward of a later micro-step of step 1 (gradient_accumulation_steps {ga}): "
                    "the gradients of the earlier micro-steps are kept")
            self.pass_(complete=True, persistent_available=False, micro=1, boundary=True, prefix="accum.")
        self.optimizer_step("optimizer_step", "optimizer step on this rank's partition (step 1: "
                            + ("optimizer states created" if self.ds.optimizer.states_per_param else "no state") + ")")
        t.phase("step2.forward", "steady state (step 2 on): forward with the optimizer states alive"
                + (" and the gradients of the earlier micro-steps" if ga > 1 else "")
                + (", ZeRO-3 prefetching over its recorded trace" if stage3 else ""))
        if ga > 1:
            self.carry_over()
        self.pass_(complete=True, persistent_available=True, micro=1 if ga > 1 else 0, boundary=True, prefix="step2.")
        self.optimizer_step("step2.optimizer_step", "steady-state optimizer step (states already exist)")
        self.evaluate()
        self.save()

    def evaluate(self) -> None:
        """The Trainer's evaluation between steps (``core/ledger/evaluation.py``): ZeRO-3 gathers the
        params module by module as in a training forward (the coordinator's highest gathered bytes of
        the steady-state forward, an estimate); stages 0-2 hold them whole."""
        from memfit.core.ledger.evaluation import record_evaluation

        gathered = self.gather_expected[1] if self.stage3 and hasattr(self, "gather_expected") else 0
        record_evaluation(self.t, self.sc, dtype_bytes=self.nb, logits_bytes=self.nb, gathered_bytes=gathered,
                          gathered_formula=f"the coordinator's highest gathered bytes in a steady-state forward: "
                                           f"{gathered:,} B", gathered_source=f"{PCO}:fetch_sub_module/release_sub_module")

    def pass_(self, *, complete: bool, persistent_available: bool, micro: int, boundary: bool, prefix: str) -> None:
        """Forward and backward of one micro-step (the forward phase is already open)."""
        t = self.t
        if self.traced is not None:
            self._traced_pass(micro=micro, boundary=boundary, prefix=prefix)
            return
        acts = self.acts
        gp = self.gather(complete, persistent_available) if self.stage3 else None
        for s in range(self.layout.n_segments):
            seg = gp.forward[s] if gp else None
            if seg:
                self.apply(seg.events[:seg.split])
            self.apply(acts.fwd[s])
            if seg:
                self.apply(seg.events[seg.split:])
            if s == self.layout.n_segments - 2:  # the last block's quantized matmuls, the activations nearly all made
                record_dequant(t, self.ctx, backward=False)
            self.apply(acts.fwd_after[s])  # the loss, once the head's modules are done
        t.phase(prefix + "backward", ("backward pass" if not prefix else
                                      "backward of a later micro-step" if prefix == "accum." else
                                      "steady-state backward") + ": gradients of the trained params"
                + (", each checkpointed block's activations rebuilt" if self.ckpt else ""))
        grads = self.grads(micro=micro, boundary=boundary) if self.opt else None
        if self.stage3 and self.opt and self.sc.ds_version == "0.5" and not (self.off and self.ga == 1):
            self._old_grads_in_partition()
        for s in range(self.layout.n_segments + 1):
            seg = gp.backward[s] if gp else None
            self.apply(acts.bwd_pre[s])  # the loss's backward, before the head's modules fetch anything
            if s == 1:  # the last block's quantized matmuls, the first to run backward
                record_dequant(t, self.ctx, backward=True)
            if seg:
                self.apply(seg.events[:seg.split])
            for n in acts.recompute_tensors[s]:
                t.alloc(RECOMPUTE, n)
            if grads:
                self.apply(grads[s].events)
            for n in reversed(acts.recompute_tensors[s]):
                t.free(RECOMPUTE, n)
            self.apply(acts.bwd_free[s])
            if seg:
                self.apply(seg.events[seg.split:])
        if gp:
            self.persist_bytes = [b or a for a, b in zip(self.persist_bytes, gp.persist_bytes)] if complete \
                else list(gp.persist_bytes)
        self._after_backward(micro)

    def _persist_bytes(self, g) -> int:
        """A persistent param's gathered copy: its all-gather buffer, ceil(p/W) x W elements. With
        W = 1 there is none unless the partition is offloaded to the host and copied to the GPU:
        ``param.data = ds_tensor.data.to(device)`` (partition_parameters.py ``_no_gather_coalesced``,
        NoGatherCoalescedHandle) is the partition itself (``zero3_fetch.Coordinator.gathered_bytes_of``).
        Not modelled: a lone persistent param, which ``Init._all_gather`` gathers sequentially
        into a new buffer even then."""
        if self.W == 1:
            offloaded = self.z.offload_param.device != "none" and self.t.accelerator == "cuda"
            return g.numel * g.element_bytes if offloaded else 0
        return ceil_div(g.numel, self.W) * self.W * g.element_bytes

    def _traced_pass(self, *, micro: int, boundary: bool, prefix: str) -> None:
        """``memfit plan --exact``: the traced step memory in place of the analytic activations (and,
        under ZeRO-3, of the gathered params and gradients the trace's coordinator replay gives)."""
        t, traced = self.t, self.traced
        if self.stage3 and not any(self.persist_bytes):
            for i, g in enumerate(self.gparams):  # the trace's replay counts persistent params as gathered
                if g.persist:
                    t.alloc(PERSIST_FULL, self._persist_bytes(g))
                    self.persist_bytes[i] = self._persist_bytes(g)
        _alloc_items(t, traced.forward_items)
        t.phase(prefix + "backward", "backward pass (traced)")
        for it in traced.forward_items:
            t.free(it.key, it.bytes)
        _alloc_items(t, traced.backward_items)
        if not self.stage3 and self.opt:
            for seg in self.grads(micro=micro, boundary=boundary):
                self.apply(seg.events)
        for it in traced.backward_items:
            t.free(it.key, it.bytes)
        self._after_backward(micro)

    def _after_backward(self, micro: int) -> None:
        """ZeRO-2 adds a later micro-step's partition into the accumulated one (the epilogue's
        ``accumulated_grad.add_``) and drops it."""
        if micro and self.z.stage == 2 and self.opt and self.z.contiguous_gradients and not self.off:
            self.t.free(GRADS_PART, self.gip_numel * self.nb)

    def _old_grads_in_partition(self) -> None:
        """0.5.10 ``partition_previous_reduced_grads``: allocated at the first backward (with the
        optimizer offloaded only when accumulating), kept until the boundary (offload: for good)."""
        if self.t.live_bytes(OLD_GRADS_PART):
            return
        self.t.alloc(OLD_GRADS_PART, self.opt_numel * self.nb)

    def carry_over(self) -> None:
        """The earlier micro-steps of a step: what they leave for the next one."""
        t = self.t
        if not self.opt:
            return
        z = self.z
        if z.stage <= 1:
            for p in self.opt:
                if p.name in self.trained:  # a frozen param DeepSpeed 0.5/0.6 optimizes has no .grad
                    t.alloc(GRADS, p.numel * self.nb)
            if z.stage == 1 and z.contiguous_gradients:  # the buckets, until the boundary (grad_pass)
                for _ in range(2 if z.overlap_comm else 1):
                    t.alloc(BUCKETS, z.reduce_bucket_size * self.nb)
        elif z.stage == 2 and z.contiguous_gradients and not self.off:
            t.alloc(GRADS_PART, self.gip_numel * self.nb)
        elif z.stage == 3 and self.sc.ds_version == "0.5":
            self._old_grads_in_partition()

    def optimizer_step(self, name: str, description: str) -> None:
        """``step()``. Without optimizer offload each partition's gradient is flattened and turned
        to fp32 on the GPU first (ZeRO-3: ``stage3.py:_prepare_fp32_grad_for_sub_group``, per sub
        group: ``flatten(averaged_gradients).to(fp32)``; ZeRO-1/2: ``stage_1_and_2.py:step``,
        ``flatten(averaged_gradients)`` then ``.to(fp32)``, the flat copy dropped, then the kept
        gradients freed before the optimizer runs); the optimizer's states are created at its
        first step (per sub group: Adam's ``zeros_like`` of each flat fp32 partition)."""
        t = self.t
        t.phase(name, description)
        if self.stage3 and self.sc.ds_version == "0.19":
            # step() -> _partition_all_parameters -> release_and_reset_all: every gathered param
            # is released, the persistent ones too (_post_step gathers them again)
            for i, b in enumerate(self.persist_bytes):
                if b:
                    t.free(PERSIST_FULL, b)
                    self.persist_bytes[i] = 0
        opt, nb, off, z = self.opt, self.nb, self.off, self.z
        if self.stage3 and opt and not off and self.sc.ds_version == "0.19":
            # _get_norm_groups -> get_grad_norm_direct: g.to(get_norm_dtype()).norm() per gradient
            # partition, fp64 where the device has it (CUDA, the CPU), one at a time
            t.declare(STEP_NORM, name="fp64 copy of one gradient partition for the gradient norm", device=Device.GPU,
                      category="grads", formula=f"ceil(p/{self.W}) x 8 B, one param at a time",
                      source=f"{S3}:get_grad_norm_direct (g.to(get_norm_dtype()).norm(norm_type)); "
                             "zero/utils.py:get_norm_dtype")
            for p in opt:
                b = ceil_div(p.numel, self.W) * 8
                t.alloc(STEP_NORM, b)
                t.free(STEP_NORM, b)
        k = self.ds.optimizer.states_per_param
        first = bool(opt and k and t.live_bytes(OPT_STATES) == 0)
        if first:
            declare_states(t, self.ctx, self.opt_numel, off, at_init=False)
        groups = list(self.groups) if self.stage3 else [self.opt_numel]
        gpu_temps = bool(opt) and not off and (z.stage >= 1 or nb != 4)
        fb = self.ctx.grad_accum_bytes if self.stage3 else nb  # the flattened gradient's dtype
        for n in (groups if opt else []):
            if gpu_temps and z.stage >= 1:
                if z.stage == 1:  # free_grad_in_param_list(params_not_in_partition) first
                    for b in self.grads_outside_partition():
                        t.free(GRADS, b)
                if fb != 4:  # .to(fp32) of an fp32 flat returns it: one tensor then
                    t.alloc(STEP_FLAT, n * fb)
                t.alloc(STEP_TMP, n * 4)
                if fb != 4:
                    t.free(STEP_FLAT, n * fb)
                if z.stage in (1, 2):  # free_grad_in_param_list: the kept gradients go before the step
                    t.free(GRADS)
                    t.free(GRADS_PART)
            if first:  # one tensor per state (exp_avg, exp_avg_sq: torch's _init_group, DeepSpeedCPUAdam)
                for _ in range(k):
                    t.alloc(OPT_STATES, n * 4)
            if gpu_temps and z.stage == 0:  # FP16_Optimizer: fp32 copy of the flat gradient
                t.alloc(STEP_TMP, n * 4)
            if gpu_temps:
                t.free(STEP_TMP, n * 4)
        if self.stage3:  # _post_step: all_gather(persistent_parameters)
            for i, g in enumerate(self.gparams):
                if g.persist and not self.persist_bytes[i]:
                    t.alloc(PERSIST_FULL, self._persist_bytes(g))
                    self.persist_bytes[i] = self._persist_bytes(g)
        t.end_phase()  # the model states after a step, gradients included
        t.free(GRADS)  # the step frees the gradients (zero_grad(set_to_none=True), free_grad_in_param_list)
        t.free(GRADS_PART)
        if self.sc.ds_version == "0.5" and not self.off:
            t.free(OLD_GRADS_PART)  # _release_ipg_buffers at the boundary (kept for good with offload)

    def grads_outside_partition(self) -> list[int]:
        """ZeRO-1: bytes of the full gradients of the trained params outside this rank's (rank 0's)
        partition of the flat buffer (those starting at or after ``partition_size``)."""
        out, start = [], 0
        for p in self.opt:
            if start >= self.opt_numel and p.trainable:
                out.append(p.numel * self.nb)
            start += p.numel
        return out

    def save(self) -> None:
        t, ctx, W, nb = self.t, self.ctx, self.W, self.nb
        t.phase("save", "saving a 16-bit model" + (" (ZeRO-3 gathers it to rank 0's host memory)" if self.stage3 else ""))
        if self.stage3 and self.z.gather_16bit_weights_on_model_save:
            mods = _modules(ctx)
            t.declare(SAVE_GPU, name="one module gathered at a time", device=Device.GPU, category="params",
                      formula=f"largest module {max(mods.values()):,} x {nb} B",
                      source="deepspeed/runtime/engine.py:_zero3_consolidated_16bit_state_dict (GatheredParameters)")
            t.alloc(SAVE_GPU, max(mods.values()) * nb)
            t.declare(SAVE_HOST, name="consolidated 16-bit state dict on rank 0", device=Device.CPU_PAGEABLE,
                      category="params", formula=f"{ctx.n_total:,} params x {nb} B, rank 0 only",
                      source="deepspeed/runtime/engine.py:_zero3_consolidated_16bit_state_dict (param.detach().cpu())",
                      rank0_only=True)
            if not (t.accelerator == "cpu" and W == 1):
                # on the CPU accelerator .cpu() returns the gathered tensor itself, and with W = 1 the
                # "gathered" param is its own partition: no new memory
                t.alloc(SAVE_HOST, ctx.n_total * nb)
            t.free(SAVE_GPU)


def _alloc_items(t: Timeline, items: tuple[LedgerItem, ...]) -> None:
    for it in items:
        t.declare(it.key, name=it.name, device=it.device, formula=it.formula, source=it.source,
                  category=it.category, exact=it.exact)
        t.alloc(it.key, it.bytes)


def record_step(t: Timeline, ctx: RecipeContext, *, opt_numel: int, traced: TracedStep | None = None,
                elem_bytes: Sequence[int] | None = None, groups: Sequence[int] | None = None) -> None:
    """Every phase after initialize (see the module docstring). ``elem_bytes``: per param, the
    element size it trains in (default: the training dtype); ``groups``: ZeRO-3's sub groups."""
    z = ctx.scenario.deepspeed.zero
    if z.stage == 3:
        zero3_streams(t, overlap_comm=bool(z.overlap_comm), ds_version=ctx.scenario.ds_version)
    _Step(t, ctx, opt_numel, traced, elem_bytes, groups).run()


def param_element_bytes(ctx: RecipeContext, where: dict[str, tuple[str, str]]) -> list[int]:
    """Per param, the element size of its storage when the step starts (ZeRO-3: its partition)."""
    return [DTYPE_BYTES[where[p.name][1]] if p.name in where else ctx.model_bytes for p in ctx.params]
