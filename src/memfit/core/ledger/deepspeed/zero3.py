"""ZeRO stage 3 inside ``deepspeed.initialize``: partitioning and the optimizer's buffers.

Mirrors the code read in docs/deepspeed-allocations.md (sections 2 and 5), DeepSpeed 0.19.8:
- ``runtime/zero/parameter_offload.py:_convert_to_zero_parameters`` -> ``partition_parameters.py:
  Init(module=...)._convert_to_zero_parameters`` (``param.data.to(local_device)``, one param at a
  time) -> ``_partition_param`` (``torch.empty(ceil(p/W))`` on the offload device, ``pin_memory()``,
  copy the slice, ``free_param``). Every param, frozen ones too. No param is persistent at this
  point in 0.19.8 (``Init.apply_param_persistence`` is never set); persistent ones are gathered
  back to the GPU at their first use (see ``step``).
- ``stage3.py:DeepSpeedZeroOptimizer_Stage3.__init__``: ``_get_trainable_parameter_groups``,
  ``_create_fp16_partitions_with_defragmentation``, ``_create_fp32_partitions``,
  ``initialize_optimizer_states``, ``create_reduce_and_remove_grad_hooks`` (gathers each trained
  param once), ``_setup_for_real_optimizer`` (IPG bucket, ``grad_partitions_flat_buffer``).
- 0.5.10 / 0.6.0: no per-param move (the engine moved the model), the flat buffer is allocated
  pinned directly, the fp32 master goes through an fp16 clone, Adam runs one step inside
  initialize, DeepSpeedCPUAdam's C++ constructor pins 2 x 128 Mi floats; 0.5.10 keeps two GPU
  temporaries of ceil(P_max/W) and has no IPG bucket or gradient-partition buffer at init.
"""

from __future__ import annotations

from memfit.core.ledger.deepspeed.common import PARTS, STAGING, declare_staging, host, pin  # noqa: F401 (re-exported)
from memfit.core.ledger.context import DTYPE_BYTES, ParamView, RecipeContext
from memfit.core.ledger.deepspeed.load import GPU_FULL, Where
from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger_types import Device

GATHER_ONE = "zero3.param_on_gpu_for_partitioning"
HOOK_GATHER = "zero3.hook_registration_gather"
FP16_FLAT = "zero3.flat_16bit_partitions"
DEFRAG_TMP = "zero3.defragment_host_copy"
FP32 = "optimizer.fp32_master"
FP32_TMP = "zero3.fp32_convert_tmp"
FP32_GRADS = "optimizer.fp32_grads"
INIT_GRAD_BUF = "zero3.init_gradient_buffer"
IPG = "zero3.ipg_bucket"
GRAD_PARTS = "zero3.grad_partitions_flat"
OPT_STATES = "optimizer.states"
CPU_ADAM_PINNED = "cpu_adam.pinned_tiles"
NVME_PARAM_POOL = "nvme.param_swap_buffers"
NVME_PARTS = "nvme.param_partitions"
NVME_OPT_POOL = "nvme.optimizer_swap_buffers"
NVME_OPT = "nvme.optimizer_state"
MIN_AIO_BYTES = 1024**2
"""swap_tensor/constants.py: tensors smaller than this stay in host memory (swappable_tensor)."""
OLD_GPU_TEMPS = "zero3.offload_gpu_temps"
P30 = "deepspeed/runtime/zero/partition_parameters.py"
S3 = "deepspeed/runtime/zero/stage3.py"

PartKey = dict[str, tuple[str, str]]
"""param name -> (ledger key of its partition, its dtype)"""


def optimized_params(ctx: RecipeContext) -> tuple[ParamView, ...]:
    """Params that get optimizer partitions: requires_grad params among those passed (0.19.8,
    ``is_optimized_parameter``); in 0.5/0.6 every passed param, frozen ones too."""
    if ctx.scenario.ds_version != "0.19" and ctx.scenario.train.model_parameters == "all":
        return ctx.params
    return ctx.trainable


def split_sub_groups(parts: list[int], sg_size: int) -> list[int]:
    """Element counts of the sub groups (stage3.py ``_create_fp16_sub_groups``: one group if it all
    fits in sub_group_size, else close a group once its running partition numel reaches it; a param
    is never split)."""
    total = sum(parts)
    if total == 0:
        return []
    if sg_size >= total:
        return [total]
    groups, cur = [], 0
    for i, n in enumerate(parts):
        cur += n
        if cur >= sg_size or i == len(parts) - 1:
            groups.append(cur)
            cur = 0
    return groups


def sub_groups(ctx: RecipeContext, params: tuple[ParamView, ...]) -> list[int]:
    return split_sub_groups([ctx.partition_numel(p) for p in params], ctx.scenario.deepspeed.zero.sub_group_size)


def record_partition(t: Timeline, ctx: RecipeContext, where: Where) -> PartKey:
    """Every param becomes a ceil(p/W) partition on the offload device (or the GPU)."""
    sc = ctx.scenario
    z = sc.deepspeed.zero
    new = sc.ds_version == "0.19"
    t.phase("initialize.partition", "ZeRO-3 converts and partitions every parameter, frozen ones too")
    declare_staging(t)
    if not new and z.offload_optimizer.device == "cpu":
        t.declare(CPU_ADAM_PINNED, name="DeepSpeedCPUAdam C++ pinned tiles (2 x 128 Mi floats)",
                  device=Device.CPU_PINNED, category="optimizer", formula="2 x 134,217,728 x 4 B",
                  source="csrc/includes/cpu_adam.h:Adam_Optimizer (cudaMallocHost, v0.5.10/v0.6.0)")
        t.alloc(CPU_ADAM_PINNED, 2 * 134_217_728 * 4)
    record_cpu_adam_op(t, ctx)
    W = ctx.world
    off = z.offload_param.device
    pinned = off != "none" and z.offload_param.pin_memory
    remote = Device.GPU if off == "none" else host(pinned)
    if off == "nvme":
        nb0 = ctx.model_bytes
        pool = z.offload_param.buffer_count * z.offload_param.buffer_size * nb0
        t.declare(NVME_PARAM_POOL, name="pinned swap buffers of the NVMe parameter swapper", device=Device.CPU_PINNED,
                  category="buffers", exact=False,
                  formula=f"buffer_count {z.offload_param.buffer_count} x buffer_size {z.offload_param.buffer_size:,} x {nb0} B (before I/O alignment)",
                  source="deepspeed/runtime/swap_tensor/partitioned_param_swapper.py:AsyncPartitionedParameterSwapper (new_cpu_locked_tensor)")
        t.alloc(NVME_PARAM_POOL, pool)
        t.declare(NVME_PARTS, name="parameter partitions swapped out to NVMe", device=Device.NVME, category="params",
                  formula=f"partitions of at least {MIN_AIO_BYTES:,} B, ceil(p/{W}) x element size",
                  source=f"{P30}:_partition_param (param_swapper.swappable_tensor -> swap_out_and_release)")
    n_frozen = sum(p.numel for p in ctx.params if not p.trainable)
    t.declare(PARTS, name="parameter partitions, 1/W of every param" + (" (offloaded)" if off != "none" else ""),
              device=remote, category="params",
              formula=f"sum over {len(ctx.params)} params of ceil(p/{W}) x element size "
                      f"({n_frozen:,} of the {ctx.n_total:,} params are frozen and partitioned all the same)",
              source=f"{P30}:_partition_param (torch.empty(partition_size, device=remote_device))")
    t.declare(GATHER_ONE, name="param moved to the GPU, one at a time, to be partitioned", device=Device.GPU,
              category="params", formula="p x element size for the param being partitioned",
              source=f"{P30}:Init._convert_to_zero_parameters (param.data = param.data.to(local_device))")
    part_key: PartKey = {}
    for p in ctx.params:
        if p.name not in where:
            continue  # already partitioned when it was built under zero.Init
        key, dtype = where[p.name]
        nb = DTYPE_BYTES[dtype]
        if key != GPU_FULL and new and t.accelerator == "cuda":  # .to(cpu) of a CPU tensor is a no-op
            t.alloc(GATHER_ONE, p.numel * nb)
            t.free(key, p.numel * nb)
            key = GATHER_ONE
        part_bytes = ctx.partition_numel(p) * nb
        if off == "nvme" and part_bytes >= MIN_AIO_BYTES:
            t.alloc(NVME_PARTS, part_bytes)  # written through the pinned pool, released from host memory
            part_key[p.name] = (NVME_PARTS, dtype)
        else:
            pin(t, PARTS, part_bytes, pinned)  # torch.empty(...) then .pin_memory(), all versions
            part_key[p.name] = (PARTS, dtype)
        t.free(key, p.numel * nb)
    return part_key


def record_optimizer(t: Timeline, ctx: RecipeContext, part_key: PartKey) -> list[int]:
    """The ZeRO-3 optimizer's buffers. Returns the sub-group sizes (elements)."""
    sc = ctx.scenario
    ds = sc.deepspeed
    z = ds.zero
    new = sc.ds_version == "0.19"
    W = ctx.world
    t.phase("initialize.optimizer", "ZeRO-3 optimizer: flat 16-bit partitions, fp32 master, gradient buffers")
    opt = optimized_params(ctx)
    if not opt:
        return []
    groups = sub_groups(ctx, opt)
    n_part = sum(groups)
    fdtype = part_key[opt[0].name][1]  # stage3: self.dtype = the first optimized param's dtype
    nb = DTYPE_BYTES[fdtype]
    off_param = z.offload_param.device != "none"
    off_opt = z.offload_optimizer.device != "none"
    opt_pin = off_opt and z.offload_optimizer.pin_memory
    opt_dev = host(opt_pin) if off_opt else Device.GPU
    master_dev = Device.CPU_PAGEABLE if off_opt else Device.GPU
    # 1. flat 16-bit partitions of the optimized params
    if off_param:
        t.declare(FP16_FLAT, name="flat 16-bit partitions of the trained params (always pinned)",
                  device=Device.CPU_PINNED, category="params", formula=f"{n_part:,} elements x {nb} B",
                  source=(f"{S3}:_create_param_groups_fp16_flat_cpu_memory (pin_memory(torch.empty(n)))" if new
                          else f"{S3}:_create_fp16_partitions_with_defragmentation (torch.empty(n, pin_memory=True))"))
        # with NVMe param offload only max_in_cpu elements get a host flat buffer; the rest stay on NVMe
        in_cpu = min(n_part, z.offload_param.max_in_cpu) if z.offload_param.device == "nvme" else n_part
        pin(t, FP16_FLAT, in_cpu * nb, new)  # 0.5/0.6 allocate pinned directly: no staging copy
        for p in opt:  # _move_to_flat_buffer: each old partition freed as it is rebound
            t.free(part_key[p.name][0], ctx.partition_numel(p) * nb)
        if in_cpu < n_part:
            t.alloc(NVME_PARTS, (n_part - in_cpu) * nb)
    else:
        t.declare(DEFRAG_TMP, name="host copy of the trained partitions while defragmenting",
                  device=Device.CPU_PAGEABLE, category="buffers", formula=f"{n_part:,} elements x {nb} B",
                  source="deepspeed/runtime/zero/utils.py:defragment (cpu_buffer)")
        t.declare(FP16_FLAT, name="flat 16-bit partitions of the trained params (defragmented)",
                  device=Device.GPU, category="params", formula=f"{n_part:,} elements x {nb} B",
                  source=f"{S3}:_create_fp16_partitions_with_defragmentation -> utils.py:defragment")
        t.alloc(DEFRAG_TMP, n_part * nb)
        for p in opt:
            t.free(part_key[p.name][0], ctx.partition_numel(p) * nb)
        t.alloc(FP16_FLAT, n_part * nb)
        t.free(DEFRAG_TMP)
    # 2. fp32 master partitions, one sub group at a time
    t.declare(FP32, name="fp32 master weights (this rank's partition)", device=master_dev, category="optimizer",
              formula=f"{n_part:,} elements x 4 B in {len(groups)} sub group(s)",
              source=f"{S3}:_create_fp32_partitions (.to(device, fp32).clone())" if new
              else f"{S3}:_create_fp32_partitions (.to(device).clone().float())")
    # Per sub group, the allocations of one iteration, in order: (temporary bytes, master bytes).
    # 0.19: ``converted = flat.to(device, fp32)`` (a new tensor unless flat is already fp32 on that
    # device) then ``converted.clone()``; the previous ``converted`` dies when the name is rebound.
    # 0.5/0.6: ``flat.to(device).clone().float()``: a 16-bit clone that dies once ``.float()`` returns.
    flat_on_master_dev = off_param == off_opt
    if new and fdtype == "fp32" and flat_on_master_dev and not off_opt:
        pass  # stage3.py:1162-1167: the flat buffer already is the fp32 master (no copy)
    else:
        if new:
            tmp_bytes = 0 if (fdtype == "fp32" and flat_on_master_dev) else 4
        else:
            tmp_bytes = nb if fdtype != "fp32" else 0
        t.declare(FP32_TMP, name="conversion temporary before the fp32 copy", device=master_dev,
                  category="optimizer", formula=f"one sub group x {tmp_bytes} B",
                  source=f"{S3}:_create_fp32_partitions")
        prev = 0
        for n in groups:
            t.alloc(FP32_TMP, n * tmp_bytes)
            if new:
                t.free(FP32_TMP, prev)
                prev = n * tmp_bytes
            t.alloc(FP32, n * 4)
            if not new:
                t.free(FP32_TMP, n * tmp_bytes)
        t.free(FP32_TMP)
    # 3. initialize_optimizer_states
    largest = max(groups)
    t.declare(INIT_GRAD_BUF, name="temporary fp32 gradient buffer (largest sub group)", device=master_dev,
              category="buffers", formula=f"{largest:,} elements x 4 B",
              source=f"{S3}:initialize_optimizer_states (gradient_buffer = torch.zeros(largest_numel))")
    t.alloc(INIT_GRAD_BUF, largest * 4)
    if off_opt:
        t.declare(FP32_GRADS, name="fp32 gradient partitions for the CPU optimizer", device=opt_dev,
                  category="grads", formula=f"{n_part:,} elements x 4 B",
                  source=f"{S3}:initialize_optimizer_states (subgroup_gradient_buffer, pin_memory())")
        for n in groups:
            pin(t, FP32_GRADS, n * 4, opt_pin)
    states = ds.optimizer.states_per_param
    if states and (not new or ds.optimizer.type == "adagrad"):
        declare_states(t, ctx, n_part, off_opt, at_init=True)
        for _ in range(states):  # one tensor per state
            t.alloc(OPT_STATES, n_part * 4)
    t.free(INIT_GRAD_BUF)
    # 4. GPU temporaries of 0.5.10 (stage3.py:869-879, with optimizer offload)
    if sc.ds_version == "0.5" and off_opt:
        big = max(ctx.partition_numel(p) for p in opt)
        t.declare(OLD_GPU_TEMPS, name="temp_grad_buffer_for_gpu_offload + temp_grad_gpu_buffer",
                  device=Device.GPU, category="buffers", formula=f"2 x ceil(P_max/W) = 2 x {big:,} x {nb} B",
                  source=f"{S3}:__init__ (v0.5.10 lines 869-879)")
        t.alloc(OLD_GPU_TEMPS, 2 * big * nb)
    # 5. _setup_for_real_optimizer: IPG bucket and gradient partitions
    if z.contiguous_gradients and sc.ds_version != "0.5":
        t.declare(IPG, name="reduce bucket (IPG buffer)", device=Device.GPU, category="buffers",
                  formula=f"reduce_bucket_size {z.reduce_bucket_size:,} x {ctx.comm_bytes} B",
                  source=f"{S3}:_setup_for_real_optimizer (torch.empty(reduce_bucket_size))")
        t.alloc(IPG, z.reduce_bucket_size * ctx.comm_bytes)
    if sc.ds_version != "0.5":
        ga = ctx.grad_accum_bytes if new else nb
        t.declare(GRAD_PARTS, name="gradient partitions (grad-accumulation dtype)", device=opt_dev,
                  category="grads", formula=f"{n_part:,} elements x {ga} B",
                  source=f"{S3}:_setup_for_real_optimizer (grad_partitions_flat_buffer)")
        pin(t, GRAD_PARTS, n_part * ga, opt_pin and new)  # 0.6.0: torch.zeros(pin_memory=True), no staging
    # 6. create_reduce_and_remove_grad_hooks (after _setup_for_real_optimizer in __init__): every trained param gathered once, then re-partitioned
    if new:
        t.declare(HOOK_GATHER, name="trained param gathered while its grad hook is registered",
                  device=Device.GPU, category="params", formula="ceil(p/W) x W x B, one param at a time",
                  source=f"{S3}:create_reduce_and_remove_grad_hooks (param.all_gather(); param.partition())")
        for p in opt:
            full = ctx.partition_numel(p) * W * nb
            t.alloc(HOOK_GATHER, full)
            t.free(HOOK_GATHER, full)
    if z.offload_optimizer.device == "nvme":
        _swap_optimizer_to_nvme(t, ctx, groups)
    return groups


def _swap_optimizer_to_nvme(t: Timeline, ctx: RecipeContext, groups: list[int]) -> None:
    """offload_optimizer nvme: fp32 masters, their gradients and the optimizer states live on NVMe
    and pass through a pool of pinned buffers of the largest sub group (swap_tensor/
    partitioned_optimizer_swapper.py, optimizer_utils.py:SwapBufferManager)."""
    z = ctx.scenario.deepspeed.zero
    largest = max(groups)
    t.declare(NVME_OPT_POOL, name="pinned swap buffers of the NVMe optimizer swapper", device=Device.CPU_PINNED,
              category="buffers", exact=False,
              formula=f"buffer_count {z.offload_optimizer.buffer_count} x largest sub group {largest:,} x 4 B",
              source="deepspeed/runtime/swap_tensor/optimizer_utils.py:SwapBufferManager (new_cpu_locked_tensor)")
    t.alloc(NVME_OPT_POOL, z.offload_optimizer.buffer_count * largest * 4)
    moved = sum(t.live_bytes(k) for k in (FP32, FP32_GRADS, OPT_STATES))
    t.declare(NVME_OPT, name="fp32 master, fp32 gradients and optimizer states on NVMe", device=Device.NVME,
              category="optimizer", formula=f"{sum(groups):,} elements x 4 B per tensor kind",
              source="deepspeed/runtime/zero/stage3.py:_create_fp32_partitions (swappable sub groups) / optimizer swapper")
    t.alloc(NVME_OPT, moved)
    for k in (FP32, FP32_GRADS, OPT_STATES):
        t.free(k)


def record_cpu_adam_op(t: Timeline, ctx: RecipeContext) -> None:
    """The basic optimizer is built before ZeRO's (engine.py ``_configure_optimizer``): with the
    optimizer offloaded, DeepSpeedCPUAdam loads the cpu_adam op (``host_process``)."""
    from memfit.core.ledger import host_process
    from memfit.core.ledger.context import optimizer_offload

    z = ctx.scenario.deepspeed.zero
    if host_process.needs_cpu_adam(z.stage, optimizer_offload(z.stage, z.offload_optimizer.device),
                                   ctx.scenario.deepspeed.optimizer.type):
        host_process.record(t, [host_process.cpu_adam_part()])


def declare_states(t: Timeline, ctx: RecipeContext, n_part: int, off_opt: bool, *, at_init: bool) -> None:
    ds = ctx.scenario.deepspeed
    states = ds.optimizer.states_per_param
    when = "created inside initialize (an init-time step)" if at_init else "created at the first step"
    src = ("deepspeed/ops/adam/cpu_adam.py:DeepSpeedCPUAdam.step (torch.zeros_like, fp32)" if off_opt
           else "optimizer step(): state tensors created lazily (torch.zeros_like)")
    nvme = ds.zero.offload_optimizer.device == "nvme" and ds.zero.stage == 3
    off_opt = off_opt and (ds.zero.stage == 3 or ds.zero.offload_optimizer.device == "cpu")
    t.declare(OPT_STATES, name=f"{ds.optimizer.type} states ({states} per trained element), {when}",
              device=Device.NVME if nvme else (Device.CPU_PAGEABLE if off_opt else Device.GPU), category="optimizer",
              formula=f"{states} x {n_part:,} elements x 4 B", source=src)
