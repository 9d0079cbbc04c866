"""ZeRO stages 0, 1 and 2 inside ``deepspeed.initialize`` (DeepSpeed 0.19.8).

Mirrors docs/deepspeed-allocations.md sections 3 and 4:
- ``runtime/zero/stage_1_and_2.py:DeepSpeedZeroOptimizer.__init__``: the trained params are
  flattened into one 16-bit buffer aligned to ``2 x W`` elements (``flatten_dense_tensors_aligned``,
  ``nccl_start_alignment_factor = 2``), the originals freed as the params are rebound to views;
  this rank's fp32 master is ``partition.clone().to(device, fp32)``; with optimizer offload, a
  16-bit host copy of the partition and two ``P_max`` gradient staging buffers (host and GPU);
  ``initialize_optimizer_states`` gives the master a zero fp32 ``.grad``.
- ``runtime/fp16/fused_optimizer.py:FP16_Optimizer`` (stage 0, fp16/bf16): per-param clones
  flattened, an fp32 master copy, and an optimizer step inside initialize (states exist after it).
Frozen params stay as the engine moved them: full, on every GPU.
"""

from __future__ import annotations

from memfit.core.ledger.context import RecipeContext, ceil_div, optimizer_offload
from memfit.core.ledger.deepspeed.load import GPU_FULL, Where
from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger.deepspeed.zero3 import (FP32, FP32_GRADS, OPT_STATES, declare_staging, declare_states, host,
                                      optimized_params, pin, record_cpu_adam_op)
from memfit.core.ledger_types import Device

FLAT = "zero12.flat_16bit_params"
CLONE_TMP = "zero12.clone_tmp"
OFFLOAD_16 = "zero12.offload_16bit_partition"
TEMP_CPU = "zero12.temp_grad_buffer_for_cpu_offload"
TEMP_GPU = "zero12.temp_grad_buffer_for_gpu_offload"
INIT_GRAD = "optimizer.init_grad"
S12 = "deepspeed/runtime/zero/stage_1_and_2.py"
F16 = "deepspeed/runtime/fp16/fused_optimizer.py"


def flat_numel(ctx: RecipeContext) -> int:
    """``S = ceil(N_tr / (2W)) x 2W`` (parameter_alignment off, DeepSpeed's default)."""
    align = 2 * ctx.world
    return ceil_div(sum(p.numel for p in optimized_params(ctx)), align) * align


def grads_in_partition_numel(numels, partition: int, trained=None) -> int:
    """Elements of ZeRO-2's contiguous gradient buffer on rank 0: every trained param that starts in
    rank 0's ``partition`` elements of the flat buffer, whole (a param straddling the boundary
    counts in full). ``stage_1_and_2.py:copy_grads_in_partition`` (0.19.8 and 0.5.10) sizes
    ``grads_in_partition`` as ``sum(p.numel() for p in params_in_partition)`` and copies each such
    param's whole gradient into it; ``get_partition_info`` puts a param in rank 0's
    ``params_in_partition`` when it starts before ``partition_size``. ``numels``: the optimized
    params in flat-buffer order; ``trained``: whether each gets a gradient (0.5/0.6 put frozen params
    passed to the optimizer in the flat buffer too). The buffer is allocated by the first
    ``copy_grads_in_partition``, which only a param with a gradient triggers: none in rank 0's
    partition, no buffer (0)."""
    total, start, used = 0, 0, trained is None
    for i, n in enumerate(numels):
        if start >= partition:
            break
        total += n
        start += n
        used = used or bool(trained[i])
    return total if used else 0


def record_zero012(t: Timeline, ctx: RecipeContext, where: Where) -> int:
    """Returns the number of elements of this rank's optimizer partition."""
    sc = ctx.scenario
    ds = sc.deepspeed
    stage = ds.zero.stage
    t.phase("initialize.partition", "stages 0-2 keep every parameter whole on every GPU: nothing to partition")
    t.phase("initialize.optimizer", f"ZeRO stage {stage} optimizer: flat 16-bit params, fp32 master, buffers")
    record_cpu_adam_op(t, ctx)
    declare_staging(t)
    opt = optimized_params(ctx)
    if not opt:
        return 0
    n_tr = sum(p.numel for p in opt)
    nb = ctx.model_bytes
    if stage == 0:
        if ds.precision == "fp32":
            return n_tr  # plain torch optimizer: nothing until the first step
        return _record_fp16_optimizer(t, ctx, where, n_tr)
    W = ctx.world
    S = flat_numel(ctx)
    part = S // W
    off = optimizer_offload(stage, ds.zero.offload_optimizer.device) != "none"
    opt_pin = off and ds.zero.offload_optimizer.pin_memory
    t.declare(FLAT, name="flat 16-bit copy of the trained params (aligned to 2W)", device=Device.GPU,
              category="params", formula=f"ceil({n_tr:,} / {2 * W}) x {2 * W} = {S:,} elements x {nb} B",
              source=f"{S12}:__init__ -> flatten_dense_tensors_aligned")
    _flatten(t, ctx, where, opt, S, n_tr)
    t.declare(CLONE_TMP, name="16-bit clone of the partition before the fp32 copy", device=Device.GPU,
              category="optimizer", formula=f"{part:,} x {nb} B", source=f"{S12}:__init__ (partition.clone())")
    t.declare(FP32, name="fp32 master weights (this rank's partition)",
              device=host(opt_pin) if off else Device.GPU, category="optimizer",
              formula=f"{S:,} / {W} = {part:,} elements x 4 B", source=f"{S12}:__init__ (.clone().to(device, fp32))")
    t.alloc(CLONE_TMP, part * nb)
    if not (ds.precision == "fp32" and not off):
        if opt_pin:
            t.declare("zero12.fp32_unpinned", name="fp32 master before pinning", device=Device.CPU_PAGEABLE,
                      category="optimizer", formula=f"{part:,} x 4 B", source=f"{S12}:__init__")
            t.alloc("zero12.fp32_unpinned", part * 4)
            t.free(CLONE_TMP)
            if t.pinning_copies:  # pin_memory(): a pinned copy, then the unpinned one dies
                t.alloc(FP32, part * 4)
                t.free("zero12.fp32_unpinned")
            else:  # CPU accelerator: pin_memory() returns the tensor itself
                t.free("zero12.fp32_unpinned")
                t.alloc(FP32, part * 4)
        else:
            t.alloc(FP32, part * 4)
            t.free(CLONE_TMP)
    else:
        t.free(CLONE_TMP)
        t.alloc(FP32, part * 4)  # the clone, already fp32, is the master
    p_max = max(p.numel for p in opt)
    if off:
        t.declare(OFFLOAD_16, name="16-bit host copy of the partition", device=host(opt_pin), category="params",
                  formula=f"{part:,} x {nb} B", source=f"{S12}:__init__ (param_buffer_of_bit16_for_cpu_offload_groups)")
        pin(t, OFFLOAD_16, part * nb, opt_pin)
        t.declare(TEMP_CPU, name="host gradient staging buffer (largest trained param)", device=host(opt_pin),
                  category="buffers", formula=f"P_max {p_max:,} x {nb} B", source=f"{S12}:__init__ (temp_grad_buffer_for_cpu_offload)")
        pin(t, TEMP_CPU, p_max * nb, opt_pin)
        t.declare(TEMP_GPU, name="GPU gradient staging buffer (largest trained param)", device=Device.GPU,
                  category="buffers", formula=f"P_max {p_max:,} x {nb} B", source=f"{S12}:__init__ (temp_grad_buffer_for_gpu_offload)")
        t.alloc(TEMP_GPU, p_max * nb)
        t.declare(FP32_GRADS, name="fp32 gradient partition for the CPU optimizer", device=host(opt_pin),
                  category="grads", formula=f"{part:,} x 4 B", source=f"{S12}:initialize_optimizer_states")
        pin(t, FP32_GRADS, part * 4, opt_pin)
    else:
        t.declare(INIT_GRAD, name="zero fp32 grad set and dropped at initialize", device=Device.GPU,
                  category="grads", formula=f"{part:,} x 4 B", source=f"{S12}:initialize_optimizer_states")
        t.alloc(INIT_GRAD, part * 4)
        t.free(INIT_GRAD)
    if ds.optimizer.type == "adagrad" and ds.optimizer.states_per_param:
        declare_states(t, ctx, part, off, at_init=True)
        for _ in range(ds.optimizer.states_per_param):  # one tensor per state
            t.alloc(OPT_STATES, part * 4)
    return part


PAD = "zero12.alignment_pad"
CPU_DATA = "zero12.flatten_cpu_copies"
PLACEHOLDER = "zero12.flatten_placeholders"
CPU_FLAT = "zero12.flatten_on_cpu"


def flatten_on_cpu(t: Timeline, ctx: RecipeContext, flat_bytes: int) -> tuple[bool, int]:
    """stage_1_and_2.py 0.19.8 ``__init__`` (lines 439-452): after ``empty_cache()``,
    ``flatten_on_accelerator = available_memory() >= flat_buffer_bytes``. ``available_memory`` is
    the driver's free memory (cuda_accelerator.py: ``pynvml ... info.free``): the card less what the
    process holds, the CUDA context included. On the CPU accelerator it is psutil's available host
    memory. Returns (flatten on the CPU, the available bytes it compared)."""
    sc = ctx.scenario
    if t.accelerator == "cpu":
        avail = sc.hardware.cpu_ram_bytes // max(sc.hardware.gpus_per_node, 1) - t.live_on(Device.CPU_PAGEABLE)
    else:
        avail = sc.hardware.gpu.total_bytes - t.live_on(Device.GPU)
    return avail < flat_bytes, avail


def _flatten(t: Timeline, ctx: RecipeContext, where: Where, opt, S: int, n_tr: int) -> None:
    """The flat 16-bit buffer, on the GPU when it fits next to the model, else through host memory."""
    nb = ctx.model_bytes
    pad = S - n_tr
    t.declare(PAD, name="alignment padding appended before flattening", device=Device.GPU, category="buffers",
              formula=f"{pad:,} elements x {nb} B", source="deepspeed/runtime/utils.py:align_dense_tensors (torch.zeros)")
    on_cpu, avail = flatten_on_cpu(t, ctx, S * nb)
    if not on_cpu:
        t.alloc(PAD, pad * nb)
        t.alloc(FLAT, S * nb)
        t.free(PAD, pad * nb)
        for p in opt:  # _update_model_bit16_weights rebinds the params to views: originals freed
            key, _ = where[p.name]
            t.free(key, p.numel * nb)
            where[p.name] = (FLAT, ctx.scenario.deepspeed.precision)
        return
    # not enough memory: each param copied to the host and replaced by a 1-element tensor, the flat
    # buffer built on the host, then moved to the GPU
    why = f"available {avail:,} B < flat buffer {S * nb:,} B"
    t.declare(CPU_DATA, name="trained params copied to host memory to flatten there", device=Device.CPU_PAGEABLE,
              category="params", formula=f"{n_tr:,} x {nb} B, one param at a time ({why})",
              source=f"{S12}:__init__ (param.cpu_data = param.data.cpu())")
    t.declare(PLACEHOLDER, name="1-element placeholders for the params moved to the host", device=Device.GPU,
              category="params", formula=f"{len(opt)} x 4 B (fp32)", source=f"{S12}:__init__ (torch.empty(1).to(param.device))")
    t.declare(CPU_FLAT, name="flat 16-bit buffer built in host memory", device=Device.CPU_PAGEABLE, category="params",
              formula=f"{S:,} elements x {nb} B ({why})",
              source=f"{S12}:__init__ (flatten_dense_tensors_aligned(use_cpu_data=True), then .to(device))")
    for p in opt:
        key, _ = where[p.name]
        if t.pinning_copies:  # .cpu() of a GPU tensor: a host copy (on the CPU accelerator: the tensor itself)
            t.alloc(CPU_DATA, p.numel * nb)
        t.alloc(PLACEHOLDER, 4)
        if t.pinning_copies:
            t.free(key, p.numel * nb)
    t.declare(PAD + ".host", name="alignment padding appended before flattening", device=Device.CPU_PAGEABLE,
              category="buffers", formula=f"{pad:,} elements x {nb} B",
              source="deepspeed/runtime/utils.py:align_dense_tensors (torch.zeros)")
    t.alloc(PAD + ".host", pad * nb)
    t.alloc(CPU_FLAT, S * nb)
    t.free(PAD + ".host", pad * nb)
    if t.pinning_copies:
        t.free(CPU_DATA)  # del param.cpu_data
        t.alloc(FLAT, S * nb)  # flattened_buffer.to(device)
        t.free(CPU_FLAT)
    else:  # the CPU accelerator: the originals were the "copies"; .to(cpu) returns the flat itself
        for p in opt:
            key, _ = where[p.name]
            t.free(key, p.numel * nb)
        t.alloc(FLAT, S * nb)
        t.free(CPU_FLAT)
    t.free(PLACEHOLDER)  # _update_model_bit16_weights: params become views of the flat buffer
    for p in opt:
        where[p.name] = (FLAT, ctx.scenario.deepspeed.precision)


def _record_fp16_optimizer(t: Timeline, ctx: RecipeContext, where: Where, n_tr: int) -> int:
    """Stage 0 with fp16/bf16: FP16_Optimizer."""
    ds = ctx.scenario.deepspeed
    nb = ctx.model_bytes
    opt = optimized_params(ctx)
    t.declare(CLONE_TMP, name="per-param clones before flattening", device=Device.GPU, category="params",
              formula=f"{n_tr:,} x {nb} B", source=f"{F16}:FP16_Optimizer.__init__ ([p.clone() for p in group])")
    t.declare(FLAT, name="flat 16-bit copy of the trained params", device=Device.GPU, category="params",
              formula=f"{n_tr:,} x {nb} B", source=f"{F16}:FP16_Optimizer.__init__ (_flatten_dense_tensors)")
    t.alloc(CLONE_TMP, n_tr * nb)
    t.alloc(FLAT, n_tr * nb)
    t.free(CLONE_TMP)
    for p in opt:
        key, _ = where[p.name]
        t.free(key, p.numel * nb)
        where[p.name] = (FLAT, ds.precision)
    t.declare(FP32, name="fp32 master weights", device=Device.GPU, category="optimizer",
              formula=f"{n_tr:,} x 4 B", source=f"{F16}:FP16_Optimizer.__init__ (.clone().float())")
    t.alloc(CLONE_TMP, n_tr * nb)
    t.alloc(FP32, n_tr * 4)
    t.free(CLONE_TMP)
    t.declare(INIT_GRAD, name="zero fp32 grad for the init-time step", device=Device.GPU, category="grads",
              formula=f"{n_tr:,} x 4 B", source=f"{F16}:FP16_Optimizer.initialize_optimizer_states")
    t.alloc(INIT_GRAD, n_tr * 4)
    if ds.optimizer.states_per_param:
        declare_states(t, ctx, n_tr, False, at_init=True)
        for _ in range(ds.optimizer.states_per_param):  # one tensor per state
            t.alloc(OPT_STATES, n_tr * 4)
    t.free(INIT_GRAD)
    return n_tr
