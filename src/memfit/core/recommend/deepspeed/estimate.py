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

from operator import add

from memfit.core.ledger.context import DTYPE_BYTES, optimizer_offload
from memfit.core.ledger import host_process
from memfit.core.ledger_types import EVAL_PHASES, PHASES
from memfit.core.ledger.deepspeed.step_segments import GradSpec
from memfit.core.recommend.deepspeed.aggregates import ScenarioAggregates
from memfit.core.recommend.deepspeed.estimate_initialize import initialize_phases, overlap_given
from memfit.core.recommend.deepspeed.space import Candidate
from memfit.core.recommend.results import PhaseEstimate

PHASE_NAMES = tuple(p for p in PHASES if p not in EVAL_PHASES)
"""Every phase, in run order, as the exact ledger names them (``phase_names`` gives a candidate's);
the evaluation phases are not estimated (the exact ledger's confirmation checks them)."""


def phase_names(c: Candidate) -> tuple[str, ...]:
    """The phases the exact ledger emits for ``c``: ``accum.*`` only with gradient accumulation."""
    if c.grad_accum > 1:
        return PHASE_NAMES
    return tuple(p for p in PHASE_NAMES if not p.startswith("accum."))


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
        init = agg.memo[key] = initialize_phases(agg, c)
    phases, g, h, n, opt_numel, states_at_init = init
    return phases + _step(agg, c, g, h, n, opt_numel, states_at_init)


Limits = tuple[int, int, float]
"""``(gpu per rank, host per node, NVMe per node)``: what the search keeps a candidate's every phase at or
under (``confirm._limits``)."""


def phase_fits(phase: tuple[int, int, int, int], limits: Limits, ranks_per_node: int) -> bool:
    """One phase's ``(gpu, host, node, nvme)`` within ``limits`` (NVMe bytes per rank x ranks per node)."""
    g, _, node, nv = phase
    return g <= limits[0] and node <= limits[1] and nv * ranks_per_node <= limits[2]


def estimate_fitting_peaks(agg: ScenarioAggregates, c: Candidate, limits: Limits
                           ) -> tuple[tuple[int, int, int, int], ...] | None:
    """``estimate_peaks`` if every phase is within ``limits`` (``phase_fits``), else None, decided on
    the phases up to the end of ``initialize`` first (memoized with them, per ``limits``): a candidate
    those rule out never computes its step phases."""
    key = ("init", c.stage, c.offload_optimizer, c.offload_param, c.pin_optimizer, c.pin_param, c.zero_init,
           c.load_dtype, c.low_cpu_mem_usage, c.precision, c.reduce_bucket_size)
    init = agg.memo.get(key)
    if init is None:
        init = agg.memo[key] = initialize_phases(agg, c)
    R = agg.ranks_per_node
    ok_key = ("init-fits", key, limits)
    ok = agg.memo.get(ok_key)
    if ok is None:
        ok = agg.memo[ok_key] = all(phase_fits(p, limits, R) for p in init[0])
    if not ok:
        return None
    phases, g, h, n, opt_numel, states_at_init = init
    step = _step(agg, c, g, h, n, opt_numel, states_at_init)
    if not all(phase_fits(p, limits, R) for p in step):
        return None
    return phases + step


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
                                   linear_saves_frozen_inputs=mel, float16=c.precision == "fp16")
    overlap = z.overlap_comm if overlap_given(sc) else c.stage == 3
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

    cublas = agg.non_pytorch().cublas_workspace_bytes
    workers = host_process.worker_part(sc.train.dataloader_workers, sc.train.dataset_tokens)
    pinned_batches = host_process.pinned_batches_bytes(sc)  # host_process.record_pinned_batches

    def micro_step(complete: bool, persistent_available: bool, micro: int, boundary: bool, carry: bool) -> None:
        # ---- forward: the phase opens, then the earlier micro-steps' gradients (carry_over)
        start = list(live)
        if not out:  # non_pytorch.record_cublas_workspace at step 1's first forward op
            live[0] += cublas
        if not out and workers is not None:  # step 1's first forward: the DataLoader forks its workers
            live[1] += workers.bytes
        if not out:
            live[1] += pinned_batches
        if carry:
            live[0] += st["carry"]
            st["kept"] = st["carry_kept"]
            if stage3 and ver == "0.5":
                alloc_old_gip()
        hpk = live[1]
        gp = gather(complete, persistent_available)[0] if stage3 else None
        gpk = live[0] + _forward_top(agg, acts, gp)
        fwd_end = live[0] + acts.total + (gp.end_forward if gp else 0)
        close(start, gpk, hpk, live[2], end=[fwd_end, live[1], live[2]])
        # ---- backward
        start = [fwd_end, live[1], live[2]]
        gr, end_grads, gr_peaks, gr_ends = grads(micro, boundary) if opt.count else (None, 0, (), ())
        if stage3 and old_gip and not (off_opt and GA == 1):
            alloc_old_gip()
        base = live[0]
        gpk = base + _backward_top(agg, acts, gp, gr_peaks if gr is not None else None, gr_ends)
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


def _forward_top(agg: ScenarioAggregates, acts, gp) -> int:  # noqa: ANN001
    """The forward's GPU peak above its start from the activations and the gathered params (ZeRO-3;
    ``gp`` None otherwise): a segment's hooks before its activations (``step_segments.Segment.before``),
    then the rest. Memoized per the two (``agg.memo`` keeps both alive, so their ids stay theirs)."""
    key = ("fwd-top", id(acts), id(gp))
    v = agg.memo.get(key)
    if v is None:
        if gp is not None:
            acts_before = (0,) + acts.forward[:-1]
            v = max(max(map(add, acts.forward, gp.forward_peaks)),
                    max(map(add, acts_before, gp.forward_before)), acts.after_forward + gp.end_forward)
        else:
            v = max(max(acts.forward), acts.after_forward)
        agg.memo[key] = v
    return v


def _backward_top(agg: ScenarioAggregates, acts, gp, gr_peaks, gr_ends) -> int:  # noqa: ANN001
    """The backward's GPU peak above its start from the activations, the gradients' segments
    (``gr_peaks``/``gr_ends``, None without optimized params) and the gathered params (``gp``, ZeRO-3);
    memoized per the three (all kept alive by ``agg.memo``)."""
    key = ("bwd-top", id(acts), id(gp), id(gr_peaks), id(gr_ends))
    v = agg.memo.get(key)
    if v is None:
        seq = acts.backward
        if gr_peaks is not None:
            seq = map(add, seq, gr_peaks)
        if gp is not None:
            seq = list(map(add, seq, gp.backward_peaks))
            # a segment's hooks before its gradients, and after them with its activations freed
            g_end = gr_ends if gr_peaks is not None else (0,) * len(acts.backward_pre)
            g_start = (0,) + tuple(g_end[:-1])
            seq += list(map(add, map(add, acts.backward_pre, g_start), gp.backward_before))
            seq += list(map(add, map(add, acts.backward_post, g_end), gp.backward_after))
        # the loss's backward runs first, with the forward's gathered params (ActivationPlan.bwd_pre)
        v = agg.memo[key] = max(acts.before_backward + (gp.end_forward if gp else 0), max(seq))
    return v


def estimate_phases(agg: ScenarioAggregates, c: Candidate) -> tuple[PhaseEstimate, ...]:
    """``estimate_peaks`` as typed per-phase results."""
    return tuple(PhaseEstimate(name=n, gpu_peak_bytes=g, cpu_peak_bytes=h, node_cpu_peak_bytes=node, nvme_bytes=nv)
                 for n, (g, h, node, nv) in zip(phase_names(c), estimate_peaks(agg, c)))
