"""Fast per-phase peaks of a candidate: the exact ledger's recipes replayed on aggregates.

``estimate_peaks(agg, cand)`` follows ``memfit.core.ledger.deepspeed.build.build_deepspeed_timeline`` recipe by recipe,
in the same order, but where a recipe loops over parameters it takes the loop's precomputed peak
and net change from ``ScenarioAggregates`` instead of walking the params, and the five phases up to
the end of ``initialize`` are memoized per the settings they depend on. What stays per candidate is
a few dozen integer additions (under 10 us warm), against 5-20 ms for the exact ledger.

The peaks are meant to be *equal* to the exact ledger's (``memfit.core.plan.make_plan`` on the
candidate's scenario) for every phase: GPU peak per rank, host peak per process, host peak per node
and NVMe bytes per rank. ``tests/core/test_recommend.py`` checks this over a grid of models, stages,
offloads (NVMe included), dtypes, DeepSpeed versions and zero.Init, and reports the largest
difference. Pinned/pageable splits and the items live at each peak are not computed here: the
exact ledger gives them for the configurations shown.

Scope: the CUDA accelerator (the search is about GPUs) and the analytic activation model (no trace).
Every step cites the recipe it mirrors: ``load`` = ``ledger/deepspeed/load.py``, ``z3`` = ``ledger/deepspeed/zero3.py``,
``z012`` = ``ledger/deepspeed/zero012.py``, ``step`` = ``ledger/deepspeed/step.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import add

from memfit.core.ledger.context import DTYPE_BYTES, optimizer_offload
from memfit.core.alloc.non_pytorch import non_pytorch_for
from memfit.core.ledger import host_process
from memfit.core.ledger_types import PHASES
from memfit.core.ledger.deepspeed.step_segments import GradSpec
from memfit.core.recommend.deepspeed.aggregates import ScenarioAggregates
from memfit.core.recommend.deepspeed.space import Candidate

CPU_ADAM_PINNED_BYTES = 2 * 134_217_728 * 4
"""DeepSpeedCPUAdam's C++ pinned tiles in 0.5/0.6 (``z3.record_partition``)."""

PHASE_NAMES = PHASES
"""Every phase, in run order, as the exact ledger names them (``phase_names`` gives a candidate's)."""


def phase_names(c: Candidate) -> tuple[str, ...]:
    """The phases the exact ledger emits for ``c``: ``accum.*`` only with gradient accumulation."""
    if c.grad_accum > 1:
        return PHASES
    return tuple(p for p in PHASES if not p.startswith("accum."))


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseEstimate:
    """One phase's peaks from the fast estimator."""

    name: str
    gpu_peak_bytes: int
    """Per rank."""
    cpu_peak_bytes: int
    """Per process (pinned + pageable)."""
    node_cpu_peak_bytes: int
    """All ranks of one node (rank-0-only items once)."""
    nvme_bytes: int
    """Per rank, on NVMe."""


class _Tally:
    """Live bytes on the GPU, the host and NVMe and each phase's peaks (``ledger.timeline.Timeline``
    with the items summed away)."""

    __slots__ = ("g", "gp", "h", "hp", "n", "np", "out", "r0")

    def __init__(self) -> None:
        self.g = self.h = self.n = 0
        self.gp = self.hp = self.np = self.r0 = -1
        self.out: list[tuple[int, int, int, int]] = []

    def phase(self) -> None:
        if self.gp >= 0:
            self.out.append((self.gp, self.hp, self.r0, self.np))
        self.gp, self.hp, self.np, self.r0 = self.g, self.h, self.n, 0

    def gpu(self, n: int) -> None:
        self.g += n
        if self.g > self.gp:
            self.gp = self.g

    def host(self, n: int) -> None:
        self.h += n
        if self.h > self.hp:
            self.hp, self.r0 = self.h, 0

    def nvme(self, n: int) -> None:
        self.n += n
        if self.n > self.np:
            self.np = self.n

    def pin(self, n: int, pinned: bool) -> None:
        """``z3.pin``: a pinned allocation goes through an unpinned staging copy of the same size."""
        if pinned:
            self.host(n)
            self.host(n)
            self.h -= n
        else:
            self.host(n)

    def loop(self, loop: tuple[int, int, int, int, int, int], scale: int = 1) -> None:
        gmax, hmax, nmax, dg, dh, dn = loop
        if self.g + gmax * scale > self.gp:
            self.gp = self.g + gmax * scale
        if self.h + hmax * scale > self.hp:
            self.hp, self.r0 = self.h + hmax * scale, 0
        if self.n + nmax * scale > self.np:
            self.np = self.n + nmax * scale
        self.g += dg * scale
        self.h += dh * scale
        self.n += dn * scale

    def peaks(self, ranks_per_node: int) -> tuple[tuple[int, int, int, int], ...]:
        """Per closed phase: (GPU, host per process, host per node, NVMe)."""
        return tuple((gp, hp, (hp - r0) * ranks_per_node + r0, np) for gp, hp, r0, np in self.out)


def estimate_peaks(agg: ScenarioAggregates, c: Candidate) -> tuple[tuple[int, int, int, int], ...]:
    """Per phase ``(gpu_peak, host_peak_per_process, node_host_peak, nvme_peak)`` in bytes, in
    ``PHASE_NAMES`` order. The hot path of the search; ``estimate_phases`` wraps it in typed results.

    The five phases up to the end of ``initialize`` do not depend on the micro-batch, checkpointing
    or the ZeRO-3 prefetch/live/persistence limits, so they are memoized per the settings they do
    depend on; the four step phases are computed for every candidate."""
    key = ("init", c.stage, c.offload_optimizer, c.offload_param, c.pin_optimizer, c.pin_param, c.zero_init,
           c.load_dtype, c.low_cpu_mem_usage, c.precision, c.reduce_bucket_size)
    init = agg.memo.get(key)
    if init is None:
        init = agg.memo[key] = _initialize(agg, c)
    phases, g, h, n, opt_numel, states_at_init = init
    return phases + _step(agg, c, g, h, n, opt_numel, states_at_init)


def _initialize(agg: ScenarioAggregates, c: Candidate) -> tuple:
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
    t = _Tally()

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
        t.host(agg.buffer_bytes)  # module buffers, in their own dtypes; they stay on the host
        t.host(agg.n_adapter * 4)
        t.phase()  # initialize.cast: skipped
        t.gpu(_context_bytes(sc))
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
        t.host(agg.buffer_bytes)  # module buffers, in their own dtypes
        t.host(agg.n_adapter * 4)
        t.phase()  # initialize.cast: per-param .to(precision) where the model sits
        t.gpu(_context_bytes(sc))
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
        opt_numel = _zero012_optimizer(t, agg, c, opt, nb=nb, off_opt=off_opt, opt_pin=opt_pin)
    t.phase()
    return t.peaks(agg.ranks_per_node), t.g, t.h, t.n, opt_numel, _states_at_init(agg, c, opt, new=new, off_opt=off_opt)


def _context_bytes(sc) -> int:  # noqa: ANN001
    """``non_pytorch.record_cuda_context``: CUDA context + NCCL buffers per rank."""
    np = non_pytorch_for(sc)
    return np.context_bytes + np.nccl_bytes


def _step(agg: ScenarioAggregates, c: Candidate, g: int, h: int, n: int, opt_numel: int, opt_states_at_init: bool
          ) -> tuple[tuple[int, int, int, int], ...]:
    """Phases forward .. save (``step.record_step``), from ``g``/``h``/``n`` bytes live after
    initialize. The phases' peaks above their start do not depend on what initialize left, so they
    are memoized per the settings the step depends on and shifted here."""
    key = ("step", c.stage, c.offload_optimizer, c.offload_param, c.precision, c.load_dtype, c.zero_init,
           c.micro_batch, c.grad_accum, c.gradient_checkpointing, c.reduce_bucket_size, c.prefetch_bucket_size,
           c.max_live_parameters, c.param_persistence_threshold, opt_numel, opt_states_at_init)
    rel = agg.memo.get(key)
    if rel is None:
        rel = agg.memo[key] = _step_relative(agg, c, opt_numel, opt_states_at_init)
    R = agg.ranks_per_node
    out = []
    for dg, dh, r0, dn, (eg, eh, en) in rel:
        hp = h + dh
        out.append((g + dg, hp, (hp - r0) * R + r0, n + dn))
        g, h, n = g + eg, h + eh, n + en
    return tuple(out)


def _step_relative(agg: ScenarioAggregates, c: Candidate, opt_numel: int, opt_states_at_init: bool) -> tuple:
    """Per step phase: (GPU, host, rank-0 host, NVMe) peaks above the phase's start, and the change
    of (GPU, host, NVMe) live bytes over the phase. Mirrors ``ledger.step._Step`` segment by
    segment with the numbers ``ledger.step_segments`` gives both."""
    sc = agg.scenario
    z = sc.deepspeed.zero
    ver = sc.ds_version
    nb = DTYPE_BYTES[c.precision]
    ga_bytes = DTYPE_BYTES[sc.deepspeed.grad_accum_dtype] if sc.deepspeed.grad_accum_dtype else nb
    stage3 = c.stage == 3
    off_opt = optimizer_offload(c.stage, c.offload_optimizer) != "none"
    opt = agg.opt_summary(ver)
    ckpt = c.gradient_checkpointing
    GA = max(c.grad_accum, 1)
    mel = stage3 and z.memory_efficient_linear
    acts = agg.activation_segments(micro_batch=c.micro_batch, dtype_bytes=nb, checkpointing=ckpt,
                                   linear_saves_frozen_inputs=mel)
    overlap = z.overlap_comm if _overlap_given(sc) else c.stage == 3
    zero_init = c.zero_init and stage3
    eb = agg.element_bytes(c.precision, c.load_dtype, zero_init)

    def gather(complete: bool, persistent_available: bool):
        return agg.gather(eb=eb, threshold=c.param_persistence_threshold, ds_version=ver, checkpointing=ckpt,
                          prefetch=c.prefetch_bucket_size, max_live=c.max_live_parameters,
                          offload_copy=c.offload_param != "none", complete=complete,
                          persistent_available=persistent_available)

    gip_numel = agg.grads_in_partition_numel(ver, opt_numel) if c.stage == 2 else 0

    def grads(micro: int, boundary: bool):
        spec = GradSpec(stage=c.stage, world=agg.world, element_bytes=nb, accum_bytes=ga_bytes,
                        reduce_bucket_size=c.reduce_bucket_size, contiguous_gradients=z.contiguous_gradients,
                        overlap_comm=bool(overlap), offload_optimizer=off_opt, boundary=boundary, micro_step=micro,
                        grads_in_partition_numel=gip_numel, old_ipg=ver == "0.5")
        return agg.grads(spec, ver, ckpt)

    out: list[tuple] = []
    live = [0, 0, 0]  # GPU, host, NVMe relative to the start of the step
    old_gip = opt_numel * nb if (stage3 and ver == "0.5" and opt.count) else 0
    old_gip_dev = 1 if off_opt else 0  # 0.5.10 grads_in_partition: host with the optimizer offloaded
    st = {"old_gip": False, "kept": 0, "carry": 0, "carry_kept": 0, "persist_rest": 0, "persist_live": 0}
    # ZeRO-1 keeps its reduce buckets from the first micro-step to the boundary (grad_pass)
    z1_buckets = (2 if overlap else 1) * c.reduce_bucket_size * nb if (
        c.stage == 1 and z.contiguous_gradients and opt.count) else 0

    def close(start: list[int], gp: int, hp: int, np_: int, r0: int = 0, end: list[int] | None = None) -> None:
        end = end or live
        out.append((gp - start[0], hp - start[1], r0, np_ - start[2],
                    (end[0] - start[0], end[1] - start[1], end[2] - start[2])))

    def alloc_old_gip() -> None:  # step._Step._old_grads_in_partition
        if old_gip and not st["old_gip"]:
            st["old_gip"] = True
            live[old_gip_dev] += old_gip

    cublas = non_pytorch_for(sc).cublas_workspace_bytes
    workers = host_process.worker_part(sc.train.dataloader_workers, sc.train.dataset_tokens)

    def micro_step(complete: bool, persistent_available: bool, micro: int, boundary: bool, carry: bool) -> None:
        # ---- forward: the phase opens, then the earlier micro-steps' gradients (carry_over)
        start = list(live)
        if not out:  # non_pytorch.record_cublas_workspace at step 1's first forward op
            live[0] += cublas
        if not out and workers is not None:  # step 1's first forward: the DataLoader forks its workers
            live[1] += workers.bytes
        if carry:
            live[0] += st["carry"]
            st["kept"] = st["carry_kept"]
            if stage3 and ver == "0.5":
                alloc_old_gip()
        hpk = live[1]
        gp = gather(complete, persistent_available)[0] if stage3 else None
        if gp is not None:
            # a segment's hooks before its activations (step_segments.Segment.before), then the rest
            acts_before = (0,) + acts.forward[:-1]
            gpk = live[0] + max(max(map(add, acts.forward, gp.forward_peaks)),
                                max(map(add, acts_before, gp.forward_before)), acts.after_forward + gp.end_forward)
        else:
            gpk = live[0] + max(max(acts.forward), acts.after_forward)
        fwd_end = live[0] + acts.total + (gp.end_forward if gp else 0)
        close(start, gpk, hpk, live[2], end=[fwd_end, live[1], live[2]])
        # ---- backward
        start = [fwd_end, live[1], live[2]]
        gr, end_grads, gr_peaks, gr_ends = grads(micro, boundary) if opt.count else (None, 0, (), ())
        if stage3 and old_gip and not (off_opt and GA == 1):
            alloc_old_gip()
        base = live[0]
        seq = acts.backward
        if gr is not None:
            seq = map(add, seq, gr_peaks)
        if gp is not None:
            seq = list(map(add, seq, gp.backward_peaks))
            # a segment's hooks before its gradients, and after them with its activations freed
            g_end = gr_ends if gr is not None else (0,) * len(acts.backward_pre)
            g_start = (0,) + tuple(g_end[:-1])
            seq += list(map(add, map(add, acts.backward_pre, g_start), gp.backward_before))
            seq += list(map(add, map(add, acts.backward_post, g_end), gp.backward_after))
        # the loss's backward runs first, with the forward's gathered params (ActivationPlan.bwd_pre)
        gpk = base + max(acts.before_backward + (gp.end_forward if gp else 0), max(seq))
        live[0] = base + (gp.end if gp else 0) + end_grads
        if micro and c.stage == 2 and opt.count and z.contiguous_gradients and not off_opt:
            live[0] -= gip_numel * nb  # _after_backward: this micro-step's partition added in and dropped
        elif not micro:
            st["carry"] = end_grads if c.stage < 3 else 0
            st["kept"] = st["carry_kept"] = st["carry"] - (z1_buckets if not boundary else 0)
        close(start, gpk, live[1], live[2])

    def optimizer_step(first: bool) -> None:  # step._Step.optimizer_step
        start = list(live)
        gpk, hpk, npk = live
        if stage3 and ver == "0.19":  # _partition_all_parameters; _post_step gathers them all again
            live[0] -= st["persist_live"]
            st["persist_rest"], st["persist_live"] = persist_total, persist_total
            if opt.count and not off_opt:  # get_grad_norm_direct: fp64 copy of one gradient partition
                gpk = max(gpk, live[0] + opt.part_max * 8)
        k = agg.states_per_param(off_opt)
        create = first and opt.count and k and not opt_states_at_init
        dev = 2 if (stage3 and c.offload_optimizer == "nvme") else 1 if off_opt else 0
        gpu_temps = opt.count and not off_opt and (c.stage >= 1 or nb != 4)
        fb = ga_bytes if stage3 else nb
        for n_i in ((opt.groups if stage3 else (opt_numel,)) if opt.count else ()):
            if gpu_temps and c.stage >= 1:
                if c.stage == 1:
                    out = agg.zero1_outside_numel(ver, opt_numel) * nb
                    live[0] -= out
                    st["kept"] -= out
                gpk = max(gpk, live[0] + n_i * 4 + (n_i * fb if fb != 4 else 0))
                live[0] += n_i * 4
                if c.stage in (1, 2):
                    live[0] -= st["kept"]
                    st["kept"] = 0
            if create:
                live[dev] += n_i * 4 * k
                gpk, hpk, npk = max(gpk, live[0]), max(hpk, live[1]), max(npk, live[2])
            if gpu_temps and c.stage == 0:
                live[0] += n_i * 4
                gpk = max(gpk, live[0])
            if gpu_temps:
                live[0] -= n_i * 4
        if st["persist_rest"]:  # _post_step gathers the persistent params
            live[0] += st["persist_rest"]
            st["persist_rest"] = 0
            gpk = max(gpk, live[0])
        live[0] -= st["kept"]  # after the phase, the step drops the gradients
        st["kept"] = 0
        if old_gip and not off_opt and st["old_gip"]:
            live[0] -= old_gip
            st["old_gip"] = False
        close(start, gpk, hpk, npk)

    persist_total = gather(True, True)[3] if stage3 else 0
    micro_step(False, False, 0, GA == 1, False)
    if stage3:  # RECORD releases every persistent param
        _, st["persist_rest"], st["persist_live"], _ = gather(False, False)
    if GA > 1:
        micro_step(True, False, 1, True, False)
        if stage3:
            _, st["persist_rest"], st["persist_live"], _ = gather(True, False)
    optimizer_step(True)
    micro_step(True, True, 1 if GA > 1 else 0, True, GA > 1)
    if stage3:
        st["persist_live"] = gather(True, True)[2]
    optimizer_step(False)
    # ---- save
    start = list(live)
    gpk, hpk, r0 = live[0], live[1], 0
    if stage3 and z.gather_16bit_weights_on_model_save:
        gpk = live[0] + agg.largest_module * nb
        hpk = live[1] + agg.n_total * nb
        r0 = agg.n_total * nb  # held by rank 0 only
        live[1] = hpk
    close(start, gpk, hpk, live[2], r0)
    return tuple(out)


def _cpu_adam_op(agg, c: Candidate) -> int:
    if host_process.needs_cpu_adam(c.stage, optimizer_offload(c.stage, c.offload_optimizer),
                                   agg.scenario.deepspeed.optimizer.type):
        return host_process.cpu_adam_part().bytes
    return 0


def _overlap_given(sc) -> bool:
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
    return ds.optimizer.type == "adagrad"


def _zero3_optimizer(t: _Tally, agg, c: Candidate, opt, *, nb: int, ga: int, new: bool, off_opt: bool,
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


def _zero012_optimizer(t: _Tally, agg, c: Candidate, opt, *, nb: int, off_opt: bool, opt_pin: bool) -> int:
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


def estimate_phases(agg: ScenarioAggregates, c: Candidate) -> tuple[PhaseEstimate, ...]:
    """``estimate_peaks`` as typed per-phase results."""
    return tuple(PhaseEstimate(name=n, gpu_peak_bytes=g, cpu_peak_bytes=h, node_cpu_peak_bytes=node, nvme_bytes=nv)
                 for n, (g, h, node, nv) in zip(phase_names(c), estimate_peaks(agg, c)))
