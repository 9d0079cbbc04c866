"""The fast estimator's phases up to the end of ``deepspeed.initialize`` (load, cast, move, partition
and the optimizer's buffers), replayed on aggregates recipe by recipe: ``load`` =
``ledger/deepspeed/load.py``, ``z3`` = ``ledger/deepspeed/zero3.py``, ``z012`` = ``ledger/deepspeed/zero012.py``.
See ``estimate`` for what is estimated and how it is checked."""

from __future__ import annotations


from memfit.core.ledger.context import DTYPE_BYTES, optimizer_offload
from memfit.core.ledger import host_process
from memfit.core.recommend.deepspeed.aggregates import ScenarioAggregates
from memfit.core.recommend.deepspeed.space import Candidate
from memfit.core.recommend.deepspeed.tally import Tally

CPU_ADAM_PINNED_BYTES = 2 * 134_217_728 * 4
"""DeepSpeedCPUAdam's C++ pinned tiles in 0.5/0.6 (``z3.record_partition``)."""


def initialize_phases(agg: ScenarioAggregates, c: Candidate) -> tuple:
    """Phases load .. initialize.optimizer. Returns (their peaks, GPU, host and NVMe bytes live at the
    end, the optimizer's partition numel, whether the optimizer states already exist)."""
    sc = agg.scenario
    ds = sc.deepspeed
    ver = sc.ds_version
    new = ver == "0.19"
    nb = DTYPE_BYTES[c.precision]
    lb = DTYPE_BYTES[c.load_dtype]
    ga = DTYPE_BYTES[ds.grad_accum_dtype] if ds.grad_accum_dtype else nb
    stage3 = c.stage == 3
    zero_init = c.zero_init and stage3
    off_opt = optimizer_offload(c.stage, c.offload_optimizer) != "none"
    off_param = stage3 and c.offload_param != "none"
    opt_pin = off_opt and c.pin_optimizer
    par_pin = off_param and c.pin_param
    remote = "pinned" if par_pin else ("pageable" if off_param else "gpu")
    opt = agg.opt_summary(ver)
    t = Tally()

    # ---- load (load.record_load / record_load_zero_init), cast, move
    t.phase()
    t.host(agg.host_load_bytes())  # ledger/deepspeed/build.record_process
    cuda_host = host_process.cuda_part().bytes  # ledger/deepspeed/build.record_cuda_host
    if zero_init:
        t.loop(agg.zero_init_build_loop(remote), nb)  # modules built whole on the GPU, then partitioned
        if sc.load.from_checkpoint:
            shard = agg.largest_shard_bytes(lb)
            t.host(shard)  # the checkpoint in host memory while loading, one shard at a time
            t.gpu(agg.zero_init_largest_gathered_module() * nb)
            t.g -= agg.zero_init_largest_gathered_module() * nb
            t.h -= shard
            t.host(agg.heap_kept_bytes(lb))  # load.record_heap_kept
            t.host(host_process.from_pretrained_part().bytes)  # load.record_from_pretrained_kept
        t.host(agg.buffer_bytes)  # module buffers, in their own dtypes; they stay on the host
        t.host(agg.n_adapter * 4)
        t.phase()  # initialize.cast: skipped
        t.gpu(_context_bytes(agg))
        t.host(cuda_host)
        t.phase()  # initialize.move: skipped
    else:
        if not c.low_cpu_mem_usage and sc.load.from_checkpoint:
            t.host(agg.n_base * lb)
            shard = agg.largest_shard_bytes(lb)
            t.host(shard)  # the state dict of the shard being loaded
            t.h -= shard
            t.host(agg.heap_kept_bytes(lb))  # load.record_heap_kept
        else:
            t.host(agg.n_base * lb)
        if sc.load.from_checkpoint:
            t.host(host_process.from_pretrained_part().bytes)  # load.record_from_pretrained_kept
        t.host(agg.buffer_bytes)  # module buffers, in their own dtypes
        t.host(agg.n_adapter * 4)
        t.phase()  # initialize.cast: per-param .to(precision) where the model sits
        t.gpu(_context_bytes(agg))
        t.host(cuda_host)
        buffers = agg.buffer_bytes
        if c.precision != "fp32":
            t.loop(agg.cast_loop(c.load_dtype, c.precision))
            if not new:  # module.half() casts floating buffers too
                loop = agg.buffer_cast_loop(c.precision)
                t.loop(loop)
                buffers += loop[4]  # host net change: the buffers now in the training dtype
        t.phase()  # initialize.move: module.to(device), params then buffers
        moved = agg.n_total * nb if c.precision != "fp32" else agg.n_base * lb + agg.n_adapter * 4
        t.gpu(moved)
        t.h -= moved
        t.gpu(buffers)
        t.h -= buffers

    # ---- partition and optimizer
    if stage3:
        t.phase()  # initialize.partition (z3.record_partition)
        if not new and c.offload_optimizer == "cpu":
            t.host(CPU_ADAM_PINNED_BYTES)
        t.host(_cpu_adam_op(agg, c))  # zero3.record_cpu_adam_op
        nvme = c.offload_param == "nvme"
        if nvme:  # the parameter swapper's pinned buffer pool
            op = sc.deepspeed.zero.offload_param
            t.host(op.buffer_count * op.buffer_size * nb)
        if zero_init:
            t.loop(agg.adapter_partition_loop(new, remote, nvme))
        else:
            t.loop(agg.partition_loop(remote, nb, nvme))
        opt_numel = _zero3_optimizer(t, agg, c, opt, nb=nb, ga=ga, new=new, off_opt=off_opt, off_param=off_param,
                                     opt_pin=opt_pin, zero_init=zero_init, ver=ver)
    else:
        t.phase()  # initialize.partition: nothing (z012.record_zero012)
        t.phase()  # initialize.optimizer
        t.host(_cpu_adam_op(agg, c))  # zero3.record_cpu_adam_op
        if new:
            opt_numel = _zero012_optimizer(t, agg, c, opt, nb=nb, off_opt=off_opt, opt_pin=opt_pin)
        else:
            opt_numel = _zero012_optimizer_old(t, agg, c, opt, nb=nb, off_opt=off_opt)
    t.phase()
    return t.peaks(agg.ranks_per_node), t.g, t.h, t.n, opt_numel, _states_at_init(agg, c, opt, new=new, off_opt=off_opt)


def _context_bytes(agg: ScenarioAggregates) -> int:
    """``non_pytorch.record_cuda_context``: CUDA context + NCCL buffers per rank."""
    np = agg.non_pytorch()
    return np.context_bytes + np.nccl_bytes


def _cpu_adam_op(agg, c: Candidate) -> int:
    if host_process.needs_cpu_adam(c.stage, optimizer_offload(c.stage, c.offload_optimizer),
                                   agg.scenario.deepspeed.optimizer.type):
        return host_process.cpu_adam_part().bytes
    return 0


def overlap_given(sc) -> bool:
    """The user's JSON sets ``overlap_comm`` (else DeepSpeed derives it from the stage)."""
    zo = sc.deepspeed_json.get("zero_optimization")
    return isinstance(zo, dict) and zo.get("overlap_comm") is not None


def _states_at_init(agg, c: Candidate, opt, *, new: bool, off_opt: bool) -> bool:
    """Whether initialize already created the optimizer states (so the first step adds none)."""
    ds = agg.scenario.deepspeed
    if not opt.count or not agg.states_per_param(off_opt):
        return False
    if c.stage == 3:
        # an NVMe optimizer swaps the states out with the rest (z3._swap_optimizer_to_nvme): the
        # first step creates them again
        return (not new or ds.optimizer.type == "adagrad") and c.offload_optimizer != "nvme"
    if c.stage == 0:
        return c.precision != "fp32"  # FP16_Optimizer steps inside initialize
    return ds.optimizer.type == "adagrad" or not new  # 0.5/0.6: initialize_optimizer_states steps


def _zero3_optimizer(t: Tally, agg, c: Candidate, opt, *, nb: int, ga: int, new: bool, off_opt: bool,
                     off_param: bool, opt_pin: bool, zero_init: bool, ver: str) -> int:
    """``z3.record_optimizer``. Returns the optimizer's partition numel."""
    t.phase()  # initialize.optimizer
    if not opt.count:
        return 0
    n_part = opt.n_part
    # the flat buffer's dtype is the first optimized param's: PEFT params converted under zero.Init
    # stay fp32 (created outside Init), everything else is in the training dtype
    fdtype = "fp32" if (zero_init and opt.first_is_adapter) else c.precision
    nbf = DTYPE_BYTES[fdtype]
    flat = n_part * nbf
    # 1. flat 16-bit partitions; the old partitions freed where they are (NVMe for the large ones
    # when params go to NVMe)
    if off_param:
        nvme = c.offload_param == "nvme"
        # with NVMe, only max_in_cpu elements get a host flat buffer; the rest stays on NVMe
        in_cpu = min(n_part, agg.scenario.deepspeed.zero.offload_param.max_in_cpu) if nvme else n_part
        t.pin(in_cpu * nbf, new)
        on_nvme = agg.opt_nvme_numel(ver, zero_init, nb) * nbf if nvme else 0
        t.h -= flat - on_nvme
        t.n -= on_nvme
        t.nvme((n_part - in_cpu) * nbf)
    else:
        t.host(flat)  # defragment's host copy
        t.h -= flat
    # 2. fp32 master, one sub group at a time, on the master's device
    flat_on_master_dev = off_param == off_opt
    if not (new and fdtype == "fp32" and flat_on_master_dev and not off_opt):
        if new:
            tmp = 0 if (fdtype == "fp32" and flat_on_master_dev) else 4
        else:
            tmp = nbf if fdtype != "fp32" else 0
        peak = agg.master_loop(ver, tmp)
        if off_opt:
            t.loop((0, peak, 0, 0, 4 * n_part, 0))
        else:
            t.loop((peak, 0, 0, 4 * n_part, 0, 0))
    # 3. initialize_optimizer_states
    init_buf = max(opt.groups) * 4
    if off_opt:
        t.host(init_buf)
        t.loop((0, agg.grads_pin_loop(ver, opt_pin), 0, 0, 4 * n_part, 0))
    else:
        t.gpu(init_buf)
    states = agg.states_per_param(off_opt)
    nvme_opt = c.offload_optimizer == "nvme"
    states_at_init = n_part * 4 * states if states and (not new or agg.scenario.deepspeed.optimizer.type == "adagrad") else 0
    if nvme_opt:
        t.nvme(states_at_init)
    elif off_opt:
        t.host(states_at_init)
    else:
        t.gpu(states_at_init)
    if off_opt:
        t.h -= init_buf
    else:
        t.g -= init_buf
    # 4. 0.5.10's two GPU temporaries
    if ver == "0.5" and off_opt:
        t.gpu(2 * opt.part_max * nbf)
    # 5. IPG bucket and gradient partitions
    if agg.scenario.deepspeed.zero.contiguous_gradients and ver != "0.5":
        t.gpu(c.reduce_bucket_size * nb)
    if ver != "0.5":
        g = n_part * (ga if new else nbf)
        if off_opt:
            t.pin(g, opt_pin and new)
        else:
            t.gpu(g)
    # 6. every trained param gathered once while its grad hook is registered
    if new:
        t.gpu(opt.part_max * agg.world * nbf)
        t.g -= opt.part_max * agg.world * nbf
    # 7. NVMe optimizer: masters, their gradients and the states move to NVMe through a pinned pool
    if nvme_opt:
        t.host(agg.scenario.deepspeed.zero.offload_optimizer.buffer_count * max(opt.groups) * 4)
        t.nvme(8 * n_part + states_at_init)  # fp32 master + fp32 grads + the states
        t.h -= 8 * n_part
        t.n -= states_at_init
    return n_part


def _zero012_optimizer(t: Tally, agg, c: Candidate, opt, *, nb: int, off_opt: bool, opt_pin: bool) -> int:
    """``z012.record_zero012``. Returns the optimizer's partition numel."""
    if not opt.count:
        return 0
    n_tr = opt.n_tr
    if c.stage == 0:
        if c.precision == "fp32":
            return n_tr
        # FP16_Optimizer: clones, flat copy, fp32 master, init grad and an init-time step
        t.gpu(n_tr * nb)
        t.gpu(n_tr * nb)
        t.g -= 2 * n_tr * nb
        t.gpu(n_tr * nb)
        t.gpu(n_tr * 4)
        t.g -= n_tr * nb
        t.gpu(n_tr * 4)
        states = agg.states_per_param(False)
        if states:
            t.gpu(n_tr * 4 * states)
        t.g -= n_tr * 4
        return n_tr
    S = opt.flat_numel
    part = S // agg.world
    pad = (S - n_tr) * nb
    if agg.scenario.hardware.gpu.total_bytes - t.g >= S * nb:  # z012._flatten: on the GPU
        t.gpu(pad)
        t.gpu(S * nb)  # flat 16-bit copy
        t.g -= pad
        t.g -= n_tr * nb  # originals freed as the params become views
    else:  # through host memory: copies, 4-byte placeholders, a host flat, then .to(device)
        t.loop((4, n_tr * nb, 0, 4 * opt.count - n_tr * nb, n_tr * nb, 0))  # per param: copy, placeholder, free
        t.host(pad)
        t.host(S * nb)
        t.h -= pad
        t.h -= n_tr * nb
        t.gpu(S * nb)
        t.h -= S * nb
        t.g -= 4 * opt.count
    t.gpu(part * nb)  # 16-bit clone of the partition
    if not (c.precision == "fp32" and not off_opt):
        if opt_pin:
            t.host(part * 4)  # fp32 master before pinning
            t.g -= part * nb
            t.host(part * 4)
            t.h -= part * 4
        else:
            if off_opt:
                t.host(part * 4)
            else:
                t.gpu(part * 4)
            t.g -= part * nb
    else:
        t.g -= part * nb
        t.gpu(part * 4)
    if off_opt:
        t.pin(part * nb, opt_pin)
        t.pin(opt.numel_max * nb, opt_pin)
        t.gpu(opt.numel_max * nb)
        t.pin(part * 4, opt_pin)
    else:
        t.gpu(part * 4)
        t.g -= part * 4
    if agg.scenario.deepspeed.optimizer.type == "adagrad":
        states = agg.states_per_param(off_opt)
        if states:
            if off_opt:
                t.host(part * 4 * states)
            else:
                t.gpu(part * 4 * states)
    return part


def _zero012_optimizer_old(t: Tally, agg, c: Candidate, opt, *, nb: int, off_opt: bool) -> int:
    """``z012._record_zero12_old`` (DeepSpeed 0.5/0.6, stages 1-2). Returns the partition numel."""
    if not opt.count:
        return 0
    if c.stage == 0:
        return _zero012_optimizer(t, agg, c, opt, nb=nb, off_opt=off_opt, opt_pin=False)
    n_tr = opt.n_tr
    S = opt.flat_numel
    part = S // agg.world
    if off_opt and agg.scenario.deepspeed.optimizer.type in ("adam", "adamw"):
        t.host(CPU_ADAM_PINNED_BYTES)
    t.loop((0, n_tr * nb, 0, -n_tr * nb, n_tr * nb, 0))  # move_to_cpu, param by param
    t.host((S - n_tr) * nb)  # alignment padding on the host
    t.host(S * nb)  # the flat buffer on the host
    t.h -= (S - n_tr) * nb
    t.gpu(S * nb)  # .cuda()
    t.h -= S * nb
    t.h -= n_tr * nb  # the params become views of the GPU flat buffer
    dev = t.host if off_opt else t.gpu
    if off_opt:
        t.host(part * nb)  # .to('cpu')
    dev(part * nb)  # .clone()
    if off_opt:
        t.h -= part * nb
    states = agg.states_per_param(off_opt)
    if nb == 4:
        dev(0)
    else:
        dev(part * 4)  # .float()
        if off_opt:
            t.h -= part * nb
        else:
            t.g -= part * nb
    if off_opt:
        t.pin(opt.numel_max * nb, True)
        t.gpu(opt.numel_max * nb)
        t.pin(part * 4, True)
        if states:
            t.host(part * 4 * states)
    else:
        t.gpu(part * 4)
        if states:
            t.gpu(part * 4 * states)
        t.g -= part * 4
    return part
