"""A training step after initialize: forward, backward, optimizer step, and saving.

What the step adds on top of what initialize left:
- activations saved for backward (analytic here; ``memfit trace`` replaces them with a traced
  figure), in the training dtype;
- ZeRO-3: parameters gathered to the GPU around each module (``partitioned_param_coordinator.py:
  fetch_sub_module``: the current module plus a prefetch of at most ``min(max_live - available,
  prefetch_bucket)`` elements), persistent params (p <= param_persistence_threshold) gathered once
  and kept (``parameter_offload.py:mark_persistent_parameters``), the full gradient of a trained
  param before it is reduce-scattered into its partition (``stage3.py:partition_grads``);
- ZeRO-1/2: gradient buckets allocated at every backward (``stage_1_and_2.py:setup_buckets``: one
  bucket of reduce_bucket_size, two with overlap_comm), stage 1 and 0 keep full gradients;
- the optimizer states, created at the first ``step()`` (0.19; earlier versions at initialize);
- save: ``engine.py:_zero3_consolidated_16bit_state_dict`` gathers one module at a time and
  copies every param to host memory on rank 0.
Items not fixed by the code alone (activations, gathered params at a given instant) say so
(``exact=False``).
"""

from __future__ import annotations

from memfit.core.activations import estimate_activation_bytes
from memfit.core.ledger.context import RecipeContext, optimizer_offload
from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger.zero3 import OPT_STATES, declare_states, optimized_params
from memfit.core.ledger_types import Device, LedgerItem, TracedStep

ACT = "step.activations"
GATHERED = "zero3.gathered_params"
PERSIST_FULL = "zero3.persistent_params_full"
GRAD_FULL = "step.full_gradient"
GRADS = "step.gradients"
BUCKETS = "zero12.reduce_buckets"
GRADS_PART = "zero12.grads_in_partition"
STEP_TMP = "step.fp32_grad_tmp"
SAVE_HOST = "save.state_dict"
SAVE_GPU = "save.gathered_module"
PCO = "deepspeed/runtime/zero/partitioned_param_coordinator.py"


def _modules(ctx: RecipeContext) -> dict[str, int]:
    """Elements per module (params directly owned, as ZeRO-3 fetches them)."""
    out: dict[str, int] = {}
    for p in ctx.params:
        mod = p.name.rsplit(".", 1)[0] if "." in p.name else ""
        out[mod] = out.get(mod, 0) + p.numel
    return out


def _alloc_items(t: Timeline, items: tuple[LedgerItem, ...]) -> None:
    for it in items:
        t.declare(it.key, name=it.name, device=it.device, formula=it.formula, source=it.source,
                  category=it.category, exact=it.exact)
        t.alloc(it.key, it.bytes)


def record_step(t: Timeline, ctx: RecipeContext, *, opt_numel: int, traced: TracedStep | None = None) -> None:
    sc = ctx.scenario
    ds = sc.deepspeed
    z = ds.zero
    W = ctx.world
    nb = ctx.model_bytes
    stage3 = z.stage == 3
    act = estimate_activation_bytes(sc.model.arch, sc.peft, seq_len=sc.train.seq_len,
                                    micro_batch=sc.train.micro_batch, dtype_bytes=nb,
                                    gradient_checkpointing=sc.train.gradient_checkpointing,
                                    attention=sc.train.attention,
                                    # ZeRO-3's memory-efficient Linear saves every Linear's input
                                    linear_saves_frozen_inputs=stage3 and z.memory_efficient_linear)
    opt = optimized_params(ctx)
    off = optimizer_offload(z.stage, z.offload_optimizer.device) != "none"
    # ---- forward
    t.phase("forward", "forward pass: activations saved for backward" + (", params gathered per module" if stage3 else ""))
    if stage3:
        # 0.19.8 parameter_offload.py: ds_numel <= threshold; 0.5/0.6 stage3.py: ds_numel < threshold
        thr = z.param_persistence_threshold
        persist = [p for p in ctx.params if (p.numel <= thr if sc.ds_version == "0.19" else p.numel < thr)]
        persist_elems, running = 0, 0
        for p in persist:
            if running + p.numel > z.model_persistence_threshold:
                continue
            running += p.numel
            persist_elems += ctx.partition_numel(p) * W
        t.declare(PERSIST_FULL, name=f"persistent params (p <= {z.param_persistence_threshold:,}) gathered and kept",
                  device=Device.GPU, category="params",
                  formula=f"{len(persist)} params, sum of ceil(p/W) x W = {persist_elems:,} elements x {nb} B",
                  source="deepspeed/runtime/zero/parameter_offload.py:mark_persistent_parameters")
        t.alloc(PERSIST_FULL, persist_elems * nb)
    if stage3 and traced is None:
        mods = _modules(ctx)
        largest_mod = max(mods.values())
        prefetch = min(z.prefetch_bucket_size, max(z.max_live_parameters - largest_mod, 0))
        gathered = min(largest_mod + prefetch, ctx.n_total)
        t.declare(GATHERED, name="params gathered for the running module plus prefetch", device=Device.GPU,
                  category="params", exact=False,
                  formula=(f"largest module {largest_mod:,} + prefetch min(prefetch_bucket {z.prefetch_bucket_size:,}, "
                           f"max_live {z.max_live_parameters:,} - module) = {gathered:,} elements x {nb} B (upper bound)"),
                  source=f"{PCO}:fetch_sub_module")
        t.alloc(GATHERED, gathered * nb)
    if traced is not None:
        _alloc_items(t, traced.forward_items)
    else:
        t.declare(ACT, name="activations saved for backward (analytic)", device=Device.GPU, category="activations",
                  exact=False, formula=act.formula,
                  source="memfit.core.activations (use `memfit plan --exact` or `memfit trace` for the traced figure)")
        t.alloc(ACT, act.total_bytes)
    # ---- backward
    t.phase("backward", "backward pass: gradients of the trained params")
    if traced is not None:
        for it in traced.forward_items:
            t.free(it.key)
        _alloc_items(t, traced.backward_items)
    if opt:
        if stage3 and traced is None:
            big = max(opt, key=lambda p: p.numel)
            full = ctx.partition_numel(big) * W
            extra = full * nb + ctx.partition_numel(big) * (ctx.grad_accum_bytes + (4 if off else 0))
            t.declare(GRAD_FULL, name="full gradient of the largest trained param, before reduce-scatter, and its partition temporaries",
                      device=Device.GPU, category="grads", exact=False,
                      formula=f"{big.numel:,} x {nb} B + ceil(p/W) x (grad-accum + fp32 copy) B",
                      source="deepspeed/runtime/zero/stage3.py:reduce_independent_p_g_buckets_and_remove_grads, partition_grads")
            t.alloc(GRAD_FULL, extra)
        else:
            n_tr = sum(p.numel for p in opt)
            if z.stage <= 1:
                t.declare(GRADS, name="full gradients of the trained params", device=Device.GPU, category="grads",
                          formula=f"{n_tr:,} x {nb} B", source="torch autograd (param.grad), reduced after backward")
                t.alloc(GRADS, n_tr * nb)
            if z.stage >= 1 and z.contiguous_gradients:
                nbuf = 2 if (z.overlap_comm if z.overlap_comm is not None else False) else 1
                t.declare(BUCKETS, name=f"gradient reduce bucket(s) x{nbuf}, allocated at every backward",
                          device=Device.GPU, category="buffers",
                          formula=f"{nbuf} x reduce_bucket_size {z.reduce_bucket_size:,} x {nb} B",
                          source="deepspeed/runtime/zero/stage_1_and_2.py:setup_buckets")
                t.alloc(BUCKETS, nbuf * z.reduce_bucket_size * nb)
            if z.stage == 2 and not off and z.contiguous_gradients:
                t.declare(GRADS_PART, name="gradient partition (grads_in_partition)", device=Device.GPU,
                          category="grads", formula=f"{opt_numel:,} x {nb} B",
                          source="deepspeed/runtime/zero/stage_1_and_2.py:grads_in_partition")
                t.alloc(GRADS_PART, opt_numel * nb)
            big = max(p.numel for p in opt)
            if z.stage == 2:
                t.declare(GRAD_FULL, name="full gradient of the largest param before it is reduced",
                          device=Device.GPU, category="grads", exact=False, formula=f"{big:,} x {nb} B",
                          source="torch autograd (param.grad)")
                t.alloc(GRAD_FULL, big * nb)
    # ---- optimizer step
    if traced is not None:
        for it in traced.backward_items:
            t.free(it.key)
    t.free(ACT)
    t.free(GATHERED)
    t.free(GRAD_FULL)
    t.free(BUCKETS)
    t.phase("optimizer_step", "optimizer step on this rank's partition")
    states = ds.optimizer.states_per_param
    if opt and states and t.live_bytes(OPT_STATES) == 0:
        declare_states(t, ctx, opt_numel, off, at_init=False)
        t.alloc(OPT_STATES, opt_numel * 4 * states)
    if opt and not off and nb != 4:
        t.declare(STEP_TMP, name="fp32 copy of this rank's gradient for the step", device=Device.GPU, category="grads",
                  formula=f"{opt_numel:,} x 4 B", source="stage3.py:_prepare_fp32_grad_for_sub_group / stage_1_and_2.py:step")
        t.alloc(STEP_TMP, opt_numel * 4)
        t.free(STEP_TMP)
    t.end_phase()  # the model states after a step, gradients included
    t.free(GRADS)  # stages 0/1: full grads are dropped by zero_grad after the step
    # ---- save
    t.phase("save", "saving a 16-bit model" + (" (ZeRO-3 gathers it to rank 0's host memory)" if stage3 else ""))
    if stage3 and z.gather_16bit_weights_on_model_save:
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
