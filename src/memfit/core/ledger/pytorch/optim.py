"""One ``optimizer.step()`` (and the gradient clipping and loss-scaler work before it) as the
allocations the code makes, tensor by tensor: the state tensors at the first step and every
temporary of the update. See ``memfit.core.optimizers`` for the code each branch mirrors.

Ledger keys: ``optimizer.states`` (state tensors on the device), ``optimizer.step_counters`` (host
0-d ``step`` tensors of torch's non-fused optimizers), ``optimizer.paged_states`` (bitsandbytes
unified memory: counted in host RAM, where the driver evicts it when the GPU runs short),
``optimizer.step_temporaries``, ``optimizer.qmaps``, ``clip.norms``, ``amp.unscale``.
"""

from __future__ import annotations

from collections.abc import Sequence

from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger.pytorch.params import TParam, free_each
from memfit.core.ledger_types import Device
from memfit.core.optimizers import BNB_QMAP_BYTES, OptimizerModel, param_states, qmaps

STATES = "optimizer.states"
COUNTERS = "optimizer.step_counters"
PAGED = "optimizer.paged_states"
TEMPS = "optimizer.step_temporaries"
QMAPS = "optimizer.qmaps"
QMAPS_HOST = "optimizer.qmaps_host"
NORMS = "clip.norms"
UNSCALE = "amp.unscale"
TEMPS_HOST = "optimizer.host_temporaries"
CLIP_SRC = "torch 2.13 nn/utils/clip_grad.py:_get_total_norm / _clip_grads_with_norm_ (foreach)"


def trainer_groups(params: Sequence[TParam], *, split: bool) -> list[list[TParam]]:
    """The Trainer's param groups (``create_optimizer``: weight decay first, then no decay; only
    trained params), or one group."""
    tr = [p for p in params if p.trainable]
    if not split:
        return [tr]
    return [g for g in ([p for p in tr if p.decay], [p for p in tr if not p.decay]) if g]


def _dtype_groups(group: list[TParam]) -> list[list[TParam]]:
    """``Optimizer._group_tensors_by_device_and_dtype``: by dtype, in order of first appearance."""
    out: dict[str, list[TParam]] = {}
    for p in group:
        out.setdefault(p.dtype, []).append(p)
    return list(out.values())


def declare_optimizer(t: Timeline, opt: OptimizerModel, n_params: int, n_elems: int) -> None:
    t.declare(STATES, name=f"{opt.label} states", device=Device.GPU, category="optimizer",
              formula=f"{_state_formula(opt)} for {n_params} trained params ({n_elems:,} elements)",
              source=opt.source)
    t.declare(COUNTERS, name="per-param 'step' counters (0-d fp32 tensors on the host)", device=Device.CPU_PAGEABLE,
              category="optimizer", formula=f"{n_params} x 4 B",
              source="torch 2.13 optim/adam.py:_init_group (step on the CPU unless fused or capturable)")
    t.declare(PAGED, name="paged optimizer states (unified memory: on the GPU while there is room, evicted to "
              "host RAM by the driver when it is short; outside torch's caching allocator, so counted here "
              "on the host)", device=Device.CPU_PAGEABLE, category="optimizer",
              formula="state tensors of params with >= 1e5 elements",
              source="bitsandbytes 0.50.2 optim/optimizer.py:get_state_buffer (F.get_paged: cudaMallocManaged)")
    t.declare(TEMPS, name=f"temporaries of {opt.label}.step()", device=Device.GPU, category="optimizer",
              formula=_temp_formula(opt), source=opt.source)
    t.declare(QMAPS, name="8-bit quantization maps on the device", device=Device.GPU, category="optimizer",
              formula=f"{qmaps(opt)} x {BNB_QMAP_BYTES} B", source="bitsandbytes 0.50.2 optim/optimizer.py:init_state")
    t.declare(NORMS, name="per-param gradient norms and their stack (clip_grad_norm_)", device=Device.GPU,
              category="grads", formula="one 0-d norm per trained param + torch.stack of them + scalars",
              source=CLIP_SRC)
    t.declare(UNSCALE, name="GradScaler.unscale_ scalars (inverse scale, found_inf)", device=Device.GPU,
              category="buffers", formula="0-d fp64 + fp32 + fp32",
              source="torch 2.13 amp/grad_scaler.py:GradScaler.unscale_")
    t.declare(TEMPS_HOST, name="host tensors the optimizer creates before copying them to the GPU",
              device=Device.CPU_PAGEABLE, category="optimizer",
              formula="Adafactor: torch.zeros(shape) on the host, then .to(grad)",
              source="transformers 5.24 optimization.py:Adafactor.step")


def _state_formula(opt: OptimizerModel) -> str:
    if opt.family == "adamw" and not opt.bnb:
        return "step (0-d fp32) + exp_avg + exp_avg_sq, each the param's size and dtype"
    if opt.family == "sgd":
        return "momentum_buffer (the grad's size and dtype)" if opt.momentum else "none (momentum 0)"
    if opt.family == "adagrad":
        return "step + sum (the param's size and dtype)"
    if opt.family == "adafactor":
        return ("exp_avg_sq_row (shape[:-1]) + exp_avg_sq_col (shape[:-2]+shape[-1:]) for 2-D params, exp_avg_sq for "
                "1-D, fp32" + (", + exp_avg" if opt.beta1 is not None else "") + ", + a 0-d RMS")
    n = "state1 + state2" if opt.family == "adamw" else "state1"
    if opt.state_bits == 8:
        return f"{n}: 1 B per element (uint8) + fp32 absmax per 256 (params < 4096 elements: fp32 states)"
    return f"{n}: fp32"


def _temp_formula(opt: OptimizerModel) -> str:
    if opt.impl == "foreach" and opt.family == "adamw":
        return "exp_avg_sq_sqrt: one tensor per param of a param group (torch._foreach_sqrt), all alive at once"
    if opt.impl == "single" and opt.family == "adamw":
        return "per param: exp_avg_sq.sqrt() and its division (2 param-sized), plus the previous param's denom"
    if opt.impl == "hf":
        return "per param: denom = exp_avg_sq.sqrt().add_(eps) (param-sized), plus the previous param's denom"
    if opt.impl == "fused":
        return "none (one fused kernel)"
    if opt.family == "adafactor":
        return ("per param: grad**2 + eps, the factored estimate, -update (fp32, param-sized, two at once), the "
                "previous param's update; 16-bit params add grad.float() and p.float()")
    if opt.bnb:
        return "none (fused CUDA kernels update in place)"
    return "grad + weight_decay x param copies when weight decay is on"


def record_clip_and_unscale(t: Timeline, trained: Sequence[TParam], *, grad_scaler: bool, max_grad_norm: float
                            ) -> None:
    """``scaler.unscale_(optimizer)`` then ``clip_grad_norm_`` (the Trainer's order), before step()."""
    if grad_scaler:
        t.alloc(UNSCALE, 8)  # self._scale.double()
        t.alloc(UNSCALE, 4)  # .reciprocal().float()
        t.free(UNSCALE, 8)
        t.alloc(UNSCALE, 4)  # found_inf = torch.full((), 0.0)
    if max_grad_norm and trained:
        sizes = [p.elem_bytes for p in trained]  # 0-d norms in each gradient's dtype
        for g in _dtype_groups(list(trained)):
            for p in g:
                t.alloc(NORMS, p.elem_bytes)  # torch._foreach_norm: one 0-d per grad
        big = max(sizes)
        t.alloc(NORMS, len(trained) * big)  # torch.stack (promoted dtype)
        t.alloc(NORMS, big)  # vector_norm of the stack: total_norm
        free_each(t, NORMS, [p.elem_bytes for g in _dtype_groups(list(trained)) for p in g])  # the per-param norms die with the list
        t.free(NORMS, len(trained) * big)
        t.alloc(NORMS, big)  # total_norm + 1e-6
        t.alloc(NORMS, big)  # max_norm / (...)
        t.free(NORMS, big)
        t.alloc(NORMS, big)  # torch.clamp(clip_coef, max=1.0)
        t.free(NORMS)  # clip_coef, the clamped one and total_norm (returned, then dropped) die


def record_optimizer_step(t: Timeline, opt: OptimizerModel, groups: list[list[TParam]], *, first: bool,
                          accelerator: str, grad_bytes) -> None:
    """``optimizer.step()``: the states at the first step, and the temporaries of the update."""
    if first and qmaps(opt) and any(p.numel >= 4096 for g in groups for p in g):
        for _ in range(qmaps(opt)):  # name2qmap[...].to(p.device): a device copy of each map
            if accelerator == "cuda":
                t.alloc(QMAPS, BNB_QMAP_BYTES)
                t.free(QMAPS_HOST, BNB_QMAP_BYTES)
    if opt.family == "adafactor":
        _adafactor(t, opt, groups, first=first, accelerator=accelerator)
        return
    for g in groups:
        if opt.bnb:  # Optimizer8bit.step: init_state then update_step, param by param
            for p in g:
                if first:
                    _alloc_states(t, opt, p, accelerator)
                if accelerator == "cpu":
                    _bnb_cpu_update(t, opt, p)
            continue
        if first and not (opt.family == "sgd"):
            for p in g:  # _init_group: lazily, param by param
                _alloc_states(t, opt, p, accelerator)
        if opt.family == "adamw":
            _adamw_temps(t, opt, g)
        elif opt.family == "sgd":
            _sgd(t, opt, g, first=first, grad_bytes=grad_bytes)
        elif opt.family == "adagrad":
            _adagrad_temps(t, opt, g)


def _bnb_cpu_update(t: Timeline, opt: OptimizerModel, p: TParam) -> None:
    """bitsandbytes' CPU backend (what a CPU replay runs; the CUDA kernels have no temporaries):
    ``backends/cpu/ops.py:_optimizer_update_32bit_cpu`` / ``_optimizer_update_8bit_blockwise_cpu``."""
    n4 = p.numel * 4
    eight = opt.state_bits == 8 and p.numel >= 4096
    live = []

    def alloc(nb: int) -> None:
        t.alloc(TEMPS, nb)
        live.append(nb)

    def free_last(k: int = 1, *, at: int | None = None) -> None:
        idx = len(live) - k if at is None else at
        t.free(TEMPS, live.pop(idx))

    if eight:
        alloc(n4)  # state1 dequantized to fp32
        if opt.family == "adamw":
            alloc(n4)  # state2 dequantized
    if p.elem_bytes != 4:
        alloc(n4)  # g.float()
        alloc(n4)  # * gnorm_scale
        free_last(2)
        alloc(n4)  # p.data.float()
    else:
        alloc(n4)  # g.float() (itself) * gnorm_scale
    if opt.family == "adamw":
        alloc(n4)  # state2.sqrt()
        alloc(n4)  # + eps (32-bit) / / correction2 (8-bit)
        free_last(2)
        if not eight:
            alloc(n4)  # state1 / (...)
            free_last(2)
    else:  # lion
        if eight:
            alloc(n4)  # state1_fp32.mul(beta1)
            alloc(n4)  # grad.mul(1 - beta1)
            alloc(n4)  # +
            free_last(2)
            free_last(2)
        else:
            alloc(n4)  # state1.mul(beta1)
            alloc(n4)  # .add(g_float)
            free_last(2)
        alloc(n4)  # .sign()
        free_last(1)
    if eight:
        blocks = -(-p.numel // 256)
        for _ in range(2 if opt.family == "adamw" else 1):  # quantize_blockwise: out + absmax, copied back
            t.alloc(TEMPS, p.numel)
            t.alloc(TEMPS, blocks * 4)
            free_each(t, TEMPS, [p.numel, blocks * 4])
    free_each(t, TEMPS, live)


def _alloc_states(t: Timeline, opt: OptimizerModel, p: TParam, accelerator: str) -> None:
    for s in param_states(opt, p.shape, p.elem_bytes, accelerator):
        if s.where == "host":
            t.alloc(COUNTERS, s.nbytes)
        elif s.where == "paged":
            t.alloc(PAGED, s.nbytes)
        else:
            t.alloc(STATES, s.nbytes)


def _adamw_temps(t: Timeline, opt: OptimizerModel, g: list[TParam]) -> None:
    if opt.impl == "fused":
        return
    if opt.impl == "foreach":
        prev: list[int] = []
        for dg in _dtype_groups(g):
            # torch._foreach_add_(state_steps, torch.tensor(1.0, device="cpu")): a host scalar
            sizes = [p.numel * p.elem_bytes for p in dg]
            for n in sizes:
                t.alloc(TEMPS, n)  # torch._foreach_sqrt(exp_avg_sqs)
            free_each(t, TEMPS, prev)  # the previous dtype group's list, rebound
            prev = sizes
        free_each(t, TEMPS, prev)
        return
    if opt.impl == "hf":  # transformers AdamW: denom = exp_avg_sq.sqrt().add_(eps), one param at a time
        prev = 0
        for p in g:
            n = p.numel * p.elem_bytes
            t.alloc(TEMPS, n)
            t.free(TEMPS, prev)
            prev = n
        t.free(TEMPS, prev)
        return
    prev = 0  # single tensor: denom = (exp_avg_sq.sqrt() / bc2).add_(eps), one param at a time
    for p in g:
        n = p.numel * p.elem_bytes
        t.alloc(TEMPS, n)  # exp_avg_sq.sqrt()
        t.alloc(TEMPS, n)  # / bias_correction2_sqrt
        t.free(TEMPS, n)  # the sqrt dies once the division returns
        t.free(TEMPS, prev)  # the previous param's denom, rebound
        prev = n
    t.free(TEMPS, prev)


def _sgd(t: Timeline, opt: OptimizerModel, g: list[TParam], *, first: bool, grad_bytes) -> None:
    wd = opt.weight_decay and all(p.decay for p in g)
    if opt.impl == "foreach":
        if wd:
            for p in g:
                t.alloc(TEMPS, grad_bytes(p))  # torch._foreach_add(grads, params, alpha=wd)
        if opt.momentum and first:
            for p in g:
                t.alloc(STATES, grad_bytes(p))  # device_grads[i].detach().clone()
        if wd:
            free_each(t, TEMPS, [grad_bytes(p) for p in g])
        return
    prev = 0
    for p in g:
        if wd:
            t.free(TEMPS, prev)  # grad = grads[i] rebinds the previous copy
            t.alloc(TEMPS, grad_bytes(p))  # grad.add(param, alpha=wd)
            prev = grad_bytes(p)
        if opt.momentum and first:
            t.alloc(STATES, grad_bytes(p))  # buf = grad.detach().clone()
    t.free(TEMPS, prev)


def _adagrad_temps(t: Timeline, opt: OptimizerModel, g: list[TParam]) -> None:
    if opt.impl == "foreach":
        for p in g:
            t.alloc(TEMPS, p.numel * p.elem_bytes)  # std = torch._foreach_sqrt(state_sums)
        free_each(t, TEMPS, [p.numel * p.elem_bytes for p in g])
        return
    prev = 0
    for p in g:
        n = p.numel * p.elem_bytes
        t.alloc(TEMPS, n)  # std = state_sum.sqrt().add_(eps)
        t.free(TEMPS, prev)
        prev = n
    t.free(TEMPS, prev)


def _adafactor(t: Timeline, opt: OptimizerModel, groups: list[list[TParam]], *, first: bool,
               accelerator: str) -> None:
    """transformers Adafactor.step, param by param (see ``memfit.core.optimizers``)."""
    prev_update = prev_grad = prev_p = 0
    for g in groups:
        for p in g:
            n4 = p.numel * 4
            sixteen = p.elem_bytes == 2
            t.free(TEMPS, prev_grad)  # grad = p.grad rebinds the previous grad.float()
            prev_grad = 0
            if sixteen:
                t.alloc(TEMPS, n4)  # grad.float()
                prev_grad = n4
            states = param_states(opt, p.shape, p.elem_bytes, accelerator)
            sizes = {s.name: s.nbytes for s in states}
            factored = len(p.shape) >= 2  # Adafactor._get_options: the code path the step takes
            # update.mean(dim=-1) / mean(dim=-2) are the factored states' shapes (fp32): one rule, theirs
            rows = sizes.get("exp_avg_sq_row", 0) // 4
            cols = sizes.get("exp_avg_sq_col", 0) // 4
            if first:
                for s in states:  # in the order Adafactor.step makes them (memfit.core.optimizers)
                    if s.name == "RMS":
                        continue  # made below, after p.float()
                    if s.name.startswith("exp_avg_sq_") and accelerator == "cuda":
                        # torch.zeros(shape).to(grad): a host tensor, then its device copy
                        t.alloc(TEMPS_HOST, s.nbytes)
                        t.alloc(STATES, s.nbytes)
                        t.free(TEMPS_HOST, s.nbytes)
                    else:
                        t.alloc(STATES, s.nbytes)  # zeros_like(grad); on the CPU torch.zeros(shape) is already there
            t.free(TEMPS, prev_p)  # p_data_fp32 = p rebinds the previous copy
            prev_p = 0
            if sixteen:
                t.alloc(TEMPS, n4)  # p.float()
                prev_p = n4
            rms = next(s.nbytes for s in states if s.name == "RMS")
            t.alloc(TEMPS, 4)  # _rms: tensor.norm(2)
            t.alloc(STATES, rms)  # / sqrt(numel): state["RMS"]
            t.free(TEMPS, 4)
            if not first:
                t.free(STATES, rms)  # the previous step's RMS tensor, replaced
            t.alloc(TEMPS, n4)  # grad**2
            t.alloc(TEMPS, n4)  # + eps
            t.free(TEMPS, n4)
            t.free(TEMPS, prev_update)  # update rebound: the previous param's update dies
            if factored:
                t.alloc(TEMPS, rows * 4)  # update.mean(dim=-1)
                t.free(TEMPS, rows * 4)
                t.alloc(TEMPS, cols * 4)  # update.mean(dim=-2)
                t.free(TEMPS, cols * 4)
                lead = rows // p.shape[-2]
                t.alloc(TEMPS, lead * 4)  # exp_avg_sq_row.mean(dim=-1, keepdim=True)
                t.alloc(TEMPS, rows * 4)  # row / mean (then rsqrt_)
                t.free(TEMPS, lead * 4)
                t.alloc(TEMPS, cols * 4)  # col.unsqueeze(-2).rsqrt()
                t.alloc(TEMPS, n4)  # torch.mul(r_factor, c_factor)
                free_each(t, TEMPS, [rows * 4, cols * 4])
                t.free(TEMPS, n4)  # the old update, rebound
            else:
                t.alloc(TEMPS, n4)  # exp_avg_sq.rsqrt()
                t.free(TEMPS, n4)  # the old update, rebound
            t.alloc(TEMPS, 4)  # _rms(update): norm
            t.alloc(TEMPS, 4)  # / sqrt(numel)
            t.free(TEMPS, 4)
            t.alloc(TEMPS, 4)  # / clip_threshold
            t.free(TEMPS, 4)
            t.free(TEMPS, 4)  # after clamp_ and div_
            prev_update = n4
            if opt.beta1 is not None:
                t.free(TEMPS, n4)  # update = exp_avg: the temporary dies
                prev_update = 0
            t.alloc(TEMPS, n4)  # -update
            t.free(TEMPS, n4)
    free_each(t, TEMPS, [prev_grad, prev_p, prev_update])  # the last param's, at return

