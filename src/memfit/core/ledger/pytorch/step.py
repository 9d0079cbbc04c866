"""Training steps outside DeepSpeed: forward, backward, (gradient accumulation), optimizer step, the
steady state of step 2 and saving, layer by layer and tensor by tensor.

Phases (contract 1): ``forward``/``backward`` (micro-step 1 of step 1), ``accum.forward``/
``accum.backward`` (a later micro-step of step 1, gradients of the earlier ones alive; only with
gradient accumulation), ``optimizer_step`` (the first ``step()``, which creates the optimizer
states), ``step2.forward``/``step2.backward``/``step2.optimizer_step`` (the steady state: states
alive; with accumulation the last micro-step, gradients alive too), ``save``.

What each phase allocates, in the order of the code:

- forward, per stage (embeddings, each block, the head): the activations saved for backward
  (``memfit.core.activations.analytic``, analytic: an estimate); under autocast the 16-bit copy of each
  fp32 Linear weight/bias it uses (``autocast_mode.cpp:cached_cast``), kept for backward when the
  layer's input needs a gradient, cached until the end of forward when the weight is a trained leaf;
  for a bitsandbytes 4-bit layer the dequantized weight while its matmul runs (``MatMul4Bit``:
  ``_dequant_linear_fallback``). Gradient checkpointing keeps only each block's input and recomputes
  one block at a time in backward.
- backward, stage by stage from the last: the gradients of the stage's trained params as autograd
  produces them (``AccumulateGrad``: the first one becomes ``.grad``; a later micro-step's is added
  in place and freed), then the stage's activations and casts are freed. Within one layer this
  takes the gradients before the activations go: an upper bound by at most one layer's gradients.
- optimizer step: ``GradScaler.unscale_`` scalars, ``clip_grad_norm_``'s per-param norms
  (``memfit.core.ledger.pytorch.optim``), ``optimizer.step()`` (states at the first step,
  temporaries), then ``zero_grad(set_to_none=True)`` frees the gradients (the Trainer's
  ``model.zero_grad()``).
- save: ``save_pretrained`` (safetensors ``_to_ndarray``: ``tensor.cpu()`` for each GPU tensor of the
  shard, all alive until the shard is written; a PEFT model saves only its adapter).

The step's context (stages, loss tensors, casts) is built in ``memfit.core.ledger.pytorch.step_context``.
A ``GradSink`` lets DDP replace what a gradient costs (buckets; ``memfit.core.ledger.pytorch.ddp``).
"""

from __future__ import annotations

from collections.abc import Callable

from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger.pytorch.optim import declare_optimizer, record_clip_and_unscale, record_optimizer_step
from memfit.core.ledger.pytorch.params import TParam, free_each
from memfit.core.ledger_types import Device
from memfit.core.precision import DTYPE_BYTES
from memfit.core.quant import GEMM_4BIT_CUSTOM_MAX_M, BLOCKSIZE_4BIT
from memfit.core.quant_kernels import bnb_release
from memfit.core.ledger.pytorch.step_context import (ACT, CASTS, DEQUANT, GRAD_TMP, LOSS, RECOMPUTE, SAVE, SCALER,
                                                   TRANSIENT, Stage, StepContext)
from memfit.core.scenario.types import Scenario


def alloc_parts(t: Timeline, key: str, parts: tuple[int, ...], lump: int) -> None:
    t.alloc_many(key, parts or (lump,))


def free_parts(t: Timeline, key: str, parts: tuple[int, ...], lump: int) -> None:
    for n in reversed(parts or (lump,)):
        t.free(key, n)


def declare_step(t: Timeline, c: StepContext) -> None:
    sc, m = c.sc, c.m
    ckpt = sc.train.gradient_checkpointing
    t.declare(LOSS, name="the loss's transients (fp32 copy of 16-bit logits, labels; gradients at backward's start)",
              device=Device.GPU, category="activations", exact=False,
              formula=f"forward {' + '.join(f'{n:,}' for n in c.loss_forward) or '0'} B; backward "
                      f"{' + '.join(f'{n:,}' for n in c.loss_backward) or '0'} B (memfit.core.activations.analytic loss_*_bytes)",
              source="transformers loss/loss_utils.py:ForCausalLMLoss (logits.float()); nll_loss / log_softmax backward")
    if c.traced:
        t.declare(ACT, name="activations saved for backward (traced, per layer)", device=Device.GPU,
                  category="activations", formula=c.act_formula,
                  source="memfit.trace (the model's own forward/backward on fake tensors), booked per stage by "
                         "memfit.core.ledger.pytorch.traced")
        t.declare(TRANSIENT, name="temporaries at the traced forward peak (while that stage runs)", device=Device.GPU,
                  category="activations", formula="the trace's temporary bytes at its forward peak",
                  source="memfit.trace (the model's own forward/backward on fake tensors)")
    else:
        t.declare(ACT, name="activations saved for backward (analytic, per layer)", device=Device.GPU,
                  category="activations", exact=False, formula=c.act_formula,
                  source="memfit.core.activations.analytic (use `memfit plan --exact` for the traced figure)")
    t.declare(RECOMPUTE, name="one block's activations recomputed in backward (gradient checkpointing)",
              device=Device.GPU, category="activations", exact=False, formula="one layer, as without checkpointing",
              source="torch/utils/checkpoint.py (non-reentrant recompute)")
    n_casts = sum(len(s.casts) for s in c.stages)
    t.declare(CASTS, name=f"autocast's {m.precision.autocast} copies of the fp32 Linear weights", device=Device.GPU,
              category="params", exact=False,
              formula=f"{n_casts} weights/biases x 2 B per element, saved for backward where the layer's input needs a "
                      "gradient (not the first block's input projections when the embeddings are frozen)"
              + ("; with checkpointing, one block's in backward" if ckpt else ""),
              source="torch 2.13 aten/src/ATen/autocast_mode.cpp:cached_cast; autograd saves the cast weight of mm")
    q = sc.quant
    fused_possible = c.tokens <= GEMM_4BIT_CUSTOM_MAX_M and not bnb_release(
        sc.runtime.bitsandbytes_version).dequantize_in_state_dtype
    t.declare(DEQUANT, name="dequantized 4-bit weight while its matmul runs (one layer at a time)", device=Device.GPU,
              category="params", exact=not fused_possible,
              formula=f"out x in x {DTYPE_BYTES[q.compute_dtype]} B (compute dtype)"
              + (" + 2 x fp32 absmax per 64 (double quant)" if q.double_quant else "")
              + ("" if not fused_possible else
                 f"; with {c.tokens} tokens (<= {GEMM_4BIT_CUSTOM_MAX_M}) the GPU may pick the fused kernel instead"),
              source=f"bitsandbytes {c.sc.runtime.bitsandbytes_version} "
                     + ("functional.py:dequantize_4bit (MatMul4Bit.forward/backward)"
                        if bnb_release(c.sc.runtime.bitsandbytes_version).dequantize_in_state_dtype else
                        "backends/cuda/ops.py:_dequant_linear_fallback; autograd/_functions.py:MatMul4Bit.backward"))
    t.declare(SCALER, name="GradScaler scale and growth tracker", device=Device.GPU, category="buffers",
              formula="0-d fp32 + 0-d int32", source="torch 2.13 amp/grad_scaler.py:_lazy_init_scale_growth_tracker")
    c.sink.declare(t, m)
    tr = m.trainable
    declare_optimizer(t, c.opt, len(tr), sum(p.numel for p in tr))


def _dequant(t: Timeline, c: StepContext, p: TParam, *, backward: bool) -> None:
    """The dequantized 4-bit weight while its matmul runs (``memfit.core.quant_kernels``).

    Backward (every release) and the forward up to 0.49: ``F.dequantize_4bit(B, state)`` (with double
    quantization the fp32 absmax rebuilt first, ``absmax += offset`` in place) in the weight's original
    dtype, then ``.to(compute dtype)`` when that differs. The forward from 0.50: ``gemm_4bit``'s
    ``_dequant_linear_fallback``: ``absmax_dq`` and ``absmax_dq + offset``, then the weight straight in
    the compute dtype."""
    q = c.sc.quant
    if q.method != "4bit":
        return
    blocks = -(-p.numel // BLOCKSIZE_4BIT)
    cb = DTYPE_BYTES[q.compute_dtype]
    if backward or bnb_release(c.sc.runtime.bitsandbytes_version).dequantize_in_state_dtype:
        nested = blocks * 4 if q.double_quant else 0
        t.alloc(DEQUANT, nested)
        t.alloc(DEQUANT, p.numel * p.elem_bytes)
        if p.elem_bytes != cb or p.dtype != q.compute_dtype:
            t.alloc(DEQUANT, p.numel * cb)
            t.free(DEQUANT, p.numel * cb)
        free_each(t, DEQUANT, [nested, p.numel * p.elem_bytes])
        return
    nested = 2 * blocks * 4 if q.double_quant else 0  # absmax_dq, then absmax_dq + offset
    t.alloc(DEQUANT, nested)
    t.alloc(DEQUANT, p.numel * cb)  # B_dq
    free_each(t, DEQUANT, [nested, p.numel * cb])


def forward_stage(t: Timeline, c: StepContext, st: Stage, block: bool) -> None:
    """One stage's forward: its activations, the dequantized weights of its quantized matmuls, its
    autocast casts (``block``: a checkpointed block, which saves nothing inside)."""
    alloc_parts(t, ACT, st.act_tensors, st.act)
    if st.transient:
        t.alloc(TRANSIENT, st.transient)
        t.free(TRANSIENT, st.transient)
    if block:  # a checkpointed block still makes its activations while it runs; only its input stays
        alloc_parts(t, RECOMPUTE, st.recompute_tensors, st.recompute)
    for p in st.quant:
        _dequant(t, c, p, backward=False)
    for n, saved, cached in st.casts:
        t.alloc(CASTS, n)
        if not cached and (block or not saved):
            t.free(CASTS, n)  # used once, not kept
    if block:
        free_parts(t, RECOMPUTE, st.recompute_tensors, st.recompute)
    if st is c.stages[-1]:  # the loss: transients next to the log-softmax it saves
        for n in c.loss_forward:
            t.alloc(LOSS, n)
        free_each(t, LOSS, c.loss_forward)


def loss_backward_start(t: Timeline, c: StepContext) -> None:
    """Backward begins at the loss (the outputs' logits already freed): nll_loss's gradient and
    log_softmax's backward result next to its saved result; then nll_loss's gradient and the saved
    result die, and 16-bit logits get their gradient cast from the fp32 one (``StepContext``)."""
    for st in c.stages:  # the outputs (logits, the cache) are gone: Trainer.compute_loss returns the loss alone
        for n in st.outputs:
            t.free(ACT, n)
    for n in c.loss_backward:
        t.alloc(LOSS, n)
    if not c.loss_saved:
        return
    nll, result = c.loss_backward
    t.free(LOSS, nll)
    t.free(ACT, c.loss_saved)
    if c.logits_grad:
        t.alloc(LOSS, c.logits_grad)
        t.free(LOSS, result)


def loss_backward_end(t: Timeline, c: StepContext) -> None:
    """The logits' gradient has gone through the head: the loss's gradients die."""
    t.free(LOSS)


def free_stage_act(t: Timeline, c: StepContext, st: Stage) -> None:
    """A stage's activations die after its backward; the head's outputs and log_softmax result went
    at the loss (``loss_backward_start``)."""
    early = [*st.outputs, *((c.loss_saved,) if c.loss_saved and st is c.stages[-1] else ())]
    if not early:
        free_parts(t, ACT, st.act_tensors, st.act)
        return
    parts = list(st.act_tensors)
    for n in early:
        if n in parts:
            parts.remove(n)
        else:  # one lump: what is left of it
            parts = []
            break
    free_parts(t, ACT, tuple(parts), st.act - sum(early))


def end_forward(t: Timeline, c: StepContext) -> None:
    """Autocast exits: its cache of trained weights' casts is cleared (those not saved for backward)."""
    ckpt = c.sc.train.gradient_checkpointing
    last = len(c.stages) - 1
    for i, st in enumerate(c.stages):
        block = ckpt and 0 < i < last
        free_each(t, CASTS, [n for n, saved, cached in st.casts if cached and (block or not saved)])


def _forward(t: Timeline, c: StepContext) -> None:
    """Every stage's forward, then autocast's exit."""
    ckpt = c.sc.train.gradient_checkpointing
    last = len(c.stages) - 1
    for i, st in enumerate(c.stages):
        forward_stage(t, c, st, ckpt and 0 < i < last)
    end_forward(t, c)


def record_workers(t: Timeline, sc: Scenario) -> None:
    """The DataLoader's worker processes, forked by the training loop's first ``iter(dataloader)``
    (``ledger.host_process.worker_part``)."""
    from memfit.core.ledger import host_process

    workers = host_process.worker_part(sc.train.dataloader_workers, sc.train.dataset_tokens)
    if workers is not None:
        host_process.record(t, [workers])
    host_process.record_pinned_batches(t, sc)


def record_forward(t: Timeline, c: StepContext, phase: str, description: str) -> None:
    t.phase(phase, description)
    if phase == "forward":
        record_workers(t, c.sc)
    c.sink.start_forward(t, phase)
    _forward(t, c)


def record_backward(t: Timeline, c: StepContext, phase: str, description: str, *, first_micro: bool,
                    last_micro: bool) -> None:
    t.phase(phase, description)
    c.sink.last_micro = last_micro
    m = c.m
    if m.precision.grad_scaler and t.live_bytes(SCALER) == 0:
        t.alloc(SCALER, 4)
        t.alloc(SCALER, 4)
    ckpt = c.sc.train.gradient_checkpointing
    last = len(c.stages) - 1
    loss_backward_start(t, c)
    for i in range(last, -1, -1):
        st = c.stages[i]
        block = ckpt and 0 < i < last
        if i == last - 1:
            loss_backward_end(t, c)
        if block:  # recompute the block's forward: its activations and saved casts again
            alloc_parts(t, RECOMPUTE, st.recompute_tensors, st.recompute)
            for p in st.quant:
                _dequant(t, c, p, backward=False)
            for n, saved, _ in st.casts:  # a fresh autocast region: cast again
                t.alloc(CASTS, n)
                if not saved:
                    t.free(CASTS, n)
        for p in reversed(st.trained):
            c.sink.on_grad(t, p, first_micro)
        for p in st.second_grads:  # AccumulateGrad: variable_grad + new_grad, out of place (the first
            n = c.sink.grad_bytes(p)  # gradient, stolen from the head's mm, is still referenced)
            t.alloc(GRAD_TMP, n)
            t.alloc(GRAD_TMP, n)
            t.free(GRAD_TMP, n)
            t.free(GRAD_TMP, n)
        for p, needs in zip(reversed(st.quant), reversed(st.quant_needs_grad_in)):
            if needs:
                _dequant(t, c, p, backward=True)
        free_stage_act(t, c, st)
        if block:
            free_parts(t, RECOMPUTE, st.recompute_tensors, st.recompute)
        free_each(t, CASTS, [n for n, saved, _ in st.casts if saved])
    c.sink.after_backward(t, m, last_micro)


def record_opt_step(t: Timeline, c: StepContext, phase: str, description: str, *, first: bool) -> None:
    t.phase(phase, description)
    m = c.m
    ts = c.sc.torch
    tr = [p for g in c.groups for p in g]
    record_clip_and_unscale(t, tr, grad_scaler=m.precision.grad_scaler, max_grad_norm=ts.max_grad_norm)
    record_optimizer_step(t, c.opt, c.groups, first=first, accelerator=t.accelerator, grad_bytes=c.sink.grad_bytes)
    t.end_phase()
    c.sink.zero_grad(t, m)
    from memfit.core.ledger.pytorch.optim import UNSCALE

    t.free(UNSCALE)


def record_steps(t: Timeline, c: StepContext) -> None:
    """Step 1 (with its accumulation micro-step) and the steady state of step 2."""
    declare_step(t, c)
    ga = c.sc.torch.gradient_accumulation_steps
    tr = c.m.trainable
    record_forward(t, c, "forward", "forward pass of micro-step 1: activations saved for backward")
    record_backward(t, c, "backward", "backward pass: gradients of the trained params, layer by layer",
                    first_micro=True, last_micro=ga == 1)
    if ga > 1:
        record_forward(t, c, "accum.forward", f"a later micro-step of {ga}: forward with the gradients alive")
        record_backward(t, c, "accum.backward", "its backward: gradients added into .grad",
                        first_micro=False, last_micro=True)
    if not tr:
        return
    record_opt_step(t, c, "optimizer_step", "first optimizer step: states created, then zero_grad", first=True)
    if ga > 1:
        t.phase("step2.forward", f"steady state, last micro-step of {ga}: states and accumulated gradients alive")
        c.sink.start_forward(t, "step2.forward")
        c.sink.last_micro = False
        for p in tr:  # the earlier micro-steps' gradients
            c.sink.on_grad(t, p, True)
        _forward(t, c)
        record_backward(t, c, "step2.backward", "steady state backward", first_micro=False, last_micro=True)
    else:
        record_forward(t, c, "step2.forward", "steady state (step 2 on): forward with the optimizer states alive")
        record_backward(t, c, "step2.backward", "steady state backward", first_micro=True, last_micro=True)
    record_opt_step(t, c, "step2.optimizer_step", "steady state optimizer step", first=False)


def record_save(t: Timeline, c: StepContext, saver: Callable[[Timeline, StepContext], None] | None = None) -> None:
    t.phase("save", "save_pretrained (a PEFT model saves its adapter)")
    if saver is not None:
        saver(t, c)
        return
    if t.accelerator != "cuda":
        return  # safetensors' _to_ndarray makes no copy of a host tensor
    sc = c.sc
    saved = [p for p in c.m.params if p.adapter] if sc.peft.method not in ("full", "freeze") else list(c.m.params)
    shard = 50 * 10**9  # save_pretrained(max_shard_size="50GB"), transformers 5.24
    nbytes, worst = 0, 0
    for p in saved:
        if nbytes and nbytes + p.nbytes > shard:
            worst = max(worst, nbytes)
            nbytes = 0
        nbytes += p.nbytes
    worst = max(worst, nbytes)
    t.declare(SAVE, name="host copy of one safetensors shard being written", device=Device.CPU_PAGEABLE,
              category="params", formula=f"largest shard {worst:,} B (max_shard_size 50 GB)",
              source="safetensors torch.py:_flatten_as_ptr (_to_ndarray: tensor.cpu()); transformers save_pretrained")
    for p in saved:
        t.alloc(SAVE, p.nbytes)
    t.free(SAVE)
