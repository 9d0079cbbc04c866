"""The training step's context outside DeepSpeed: the per-stage activations (analytic, or the
trace's with ``--exact``), the loss's tensors, autocast's casts and the gradient sink, built once
per plan from the scenario and read by the recording functions (``memfit.core.ledger.pytorch.step``)."""

from __future__ import annotations

from dataclasses import field, replace

from memfit.core.lean_dataclass import dataclass
from memfit.core.activations.adapters import AdapterActivations, Quantization, adapter_activations, quantized_layers
from memfit.core.activations.analytic import estimate_activation_bytes
from memfit.core.activations.tensors import ActivationTensors, split_estimate
from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger.pytorch.optim import trainer_groups
from memfit.core.ledger.pytorch.params import TorchModel, TParam
from memfit.core.ledger.pytorch.traced import traced_stages
from memfit.core.ledger_types import Device, TracedStep
from memfit.core.optimizers import OptimizerModel
from memfit.core.precision import DTYPE_BYTES
from memfit.core.quant_kernels import bnb_release
from memfit.core.scenario.types import Scenario

ACT = "step.activations"
RECOMPUTE = "step.recompute"
TRANSIENT = "step.traced_temporaries"
CASTS = "amp.weight_casts"
DEQUANT = "quant.dequantized_weight"
LOSS = "step.loss_transients"
GRADS = "step.gradients"
GRAD_TMP = "step.grad_to_accumulate"
SCALER = "amp.grad_scaler"
SAVE = "save.state_dict"
_INPUT_PROJ = ("q_proj", "k_proj", "v_proj", "c_attn", "query_key_value", "qkv_proj", "Wqkv", "query", "key",
               "value", "q", "k", "v")
_PARALLEL = ("gptj", "gpt_neox", "falcon", "phi", "codegen")
"""Families whose first block's MLP reads the same norm output as attention (parallel residual)."""
_MLP_IN = ("fc_in", "dense_h_to_4h", "fc1", "fc_out", "dense_4h_to_h", "fc2")


@dataclass
class GradSink:
    """What a gradient costs when autograd produces it (plain torch: a ``.grad`` tensor)."""

    key: str = GRADS
    last_micro: bool = True
    """The backward being recorded is the last micro-step of a step (DDP syncs only then)."""

    def start_forward(self, t: Timeline, phase: str) -> None:
        """Work at the start of a forward (DDP's bucket rebuild and buffer broadcast)."""

    def declare(self, t: Timeline, m: TorchModel) -> None:
        tr = m.trainable
        t.declare(GRADS, name="gradients of the trained params (.grad, the param's dtype)", device=Device.GPU,
                  category="grads", formula=f"{sum(p.numel for p in tr):,} elements, one tensor per param",
                  source="torch autograd AccumulateGrad (the first gradient becomes .grad)")
        t.declare(GRAD_TMP, name="a later micro-step's gradient before it is added into .grad", device=Device.GPU,
                  category="grads", formula="one param's gradient at a time",
                  source="torch/csrc/autograd/functions/accumulate_grad.h (variable_grad += new_grad)")

    def on_grad(self, t: Timeline, p: TParam, first_micro: bool) -> None:
        n = p.numel * p.elem_bytes
        if first_micro:
            t.alloc(GRADS, n)
        else:
            t.alloc(GRAD_TMP, n)
            t.free(GRAD_TMP, n)

    def after_backward(self, t: Timeline, m: TorchModel, last_micro: bool) -> None:
        """Work at the end of backward (DDP's reducer finalization)."""

    def zero_grad(self, t: Timeline, m: TorchModel) -> None:
        t.free(GRADS)

    def grad_bytes(self, p: TParam) -> int:
        return p.numel * p.elem_bytes


@dataclass
class Stage:
    act: int = 0
    recompute: int = 0
    act_tensors: tuple[int, ...] = ()
    """``act`` as the tensors it is (``memfit.core.activations.tensors``); empty: one tensor."""
    recompute_tensors: tuple[int, ...] = ()
    transient: int = 0
    """Bytes alive only while the stage's forward runs (a traced step's temporaries at its peak)."""
    casts: list[tuple[int, bool, bool]] = field(default_factory=list)
    """Autocast copies made by the stage: (bytes, saved by autograd for backward, cached by autocast
    until the end of forward because the weight is a trained fp32 leaf)."""
    quant: list[TParam] = field(default_factory=list)
    quant_needs_grad_in: list[bool] = field(default_factory=list)
    trained: list[TParam] = field(default_factory=list)
    second_grads: list[TParam] = field(default_factory=list)
    """Trained params whose gradient was already made by a later stage (a tied embedding used by
    the head): their contribution here is added into it."""
    outputs: tuple[int, ...] = ()
    """Of ``act``, what only the model's outputs hold (the logits, the cache's k and v that no kernel
    saved): freed as backward starts (``loss_backward_start``)."""


@dataclass
class StepContext:
    sc: Scenario
    m: TorchModel
    opt: OptimizerModel
    sink: GradSink
    stages: list[Stage]
    act_formula: str
    tokens: int
    groups: list[list[TParam]]
    loss_forward: tuple[int, ...] = ()
    """Tensors alive only while the loss runs: the fp32 copy of 16-bit logits, the shifted labels."""
    loss_backward: tuple[int, ...] = ()
    """Tensors alive at the start of backward: nll_loss's and log_softmax's gradients (logits-sized)."""
    loss_saved: int = 0
    """log_softmax's saved result, released once its backward has run (before the head's)."""
    logits_grad: int = 0
    """The logits' gradient in their 16-bit dtype (``ToCopyBackward0`` of ``logits.float()``); 0 for fp32
    logits, whose gradient is log_softmax's backward result itself."""
    stream_bytes: int = 4
    """Element size of the residual stream (the activations' dtype)."""
    logits_bytes: int = 4
    """Element size of the logits (16-bit where the head's matmul runs in 16 bits)."""
    traced: bool = False
    """The stages' activations come from a traced step (``memfit plan --exact``), not the estimate."""


def _leaf(p: TParam) -> str:
    """The name of the layer whose input a param's matmul reads: a LoRA ``lora_A`` reads its base
    layer's input (``lora_B`` reads ``lora_A``'s output, which needs a gradient)."""
    mod = p.module.replace(".base_layer", "")
    if ".lora_A." in mod:
        mod = mod.split(".lora_A.", 1)[0]
    return mod.rsplit(".", 1)[-1]


def torch_adapters(sc: Scenario, m: TorchModel) -> AdapterActivations | None:
    """The PEFT adapters' saved tensors in the torch loop: adapters in their own dtype (fp32: peft's
    ``autocast_adapter_dtype``), autocast's dtype under AMP, the base weights' dtype; peft upcast the
    adapters when the base was loaded in 16 bits."""
    adapter = next((p for p in m.params if p.adapter and p.trainable), None)
    base = next((p for p in m.params if not p.adapter and p.linear and not p.quantized), None)
    auto = m.precision.autocast
    quant = None
    modules: set[str] = set()
    if m.quant.enabled:
        modules = {p.module.replace(".base_layer", "").removeprefix("base_model.model.") for p in m.params if p.quantized}
        quant = Quantization(method=m.quant.method, compute_bytes=DTYPE_BYTES[m.quant.compute_dtype],
                             release=bnb_release(sc.runtime.bitsandbytes_version),
                             layers=quantized_layers(sc.model, modules))
    acts = adapter_activations(sc.model, sc.peft, adapter_bytes=adapter.elem_bytes if adapter else 4,
                               autocast_bytes=DTYPE_BYTES[auto] if auto else 0,
                               base_bytes=base.elem_bytes if base else 0, upcast=sc.load.dtype in ("fp16", "bf16"),
                               quantized=quant)
    if acts is None or not modules:
        return acts
    return replace(acts, layers=tuple(replace(layer, quantized=layer.module in modules) for layer in acts.layers))


def _memo(cache: dict | None, objs: tuple, values: tuple, build):  # noqa: ANN001, ANN202
    """``build()``, memoized in ``cache`` (None: not memoized) per the identity of ``objs`` (kept alive
    with the entry, so an id is never reused while it is a key) and the hashable ``values``."""
    if cache is None:
        return build()
    key = ("step_context", tuple(id(o) for o in objs), values)
    hit = cache.get(key)
    if hit is not None:
        return hit[1]
    v = build()
    cache[key] = (objs, v)
    return v


def build_step_context(sc: Scenario, m: TorchModel, opt: OptimizerModel, sink: GradSink,
                       traced: TracedStep | None = None, cache: dict | None = None) -> StepContext:
    """The step's per-stage figures; with ``traced`` (``memfit plan --exact``) each stage's activations
    are the trace's (``ledger/pytorch/traced.py``), the rest (casts, dequantized weights, gradients,
    and a checkpointed block's recompute) the recipes' own. ``cache``: the recommender's dict shared
    between candidates (``ledger.pytorch.build``'s ``step_cache``; a plan passes none): the adapters' and the activation
    model's results (pure functions of the model, the PEFT spec and the numbers in their keys) are
    computed once per distinct input."""
    pm = m.precision
    ckpt = sc.train.gradient_checkpointing
    # the activations' element size: the residual stream's dtype, i.e. the input embedding's (fp32 under
    # AMP on an fp32 model and after prepare_model_for_kbit_training: autocast makes the matmul outputs
    # 16-bit but adding them to the stream promotes back to fp32)
    emb = next((p for p in m.params if p.stage == 0 and len(p.shape) == 2 and not p.adapter and not p.quantized), None)
    D = emb.elem_bytes if emb is not None else (2 if pm.autocast or pm.pure else 4)
    fp16 = (emb.dtype if emb is not None else pm.pure) == "fp16"
    if sc.framework in ("fsdp", "fsdp2") and sc.fsdp.mixed_precision != "none":
        D = 2  # FSDP's mixed precision computes with 16-bit unsharded params: a 16-bit stream
        fp16 = sc.fsdp.mixed_precision == "fp16"
    fp16 = fp16 and D == 2  # a float16 stream (T5's blocks clamp it), not bfloat16
    # the matmul outputs' element size: autocast's 16-bit dtype (under AMP on an fp32 stream they are
    # 16-bit while the residual sums stay fp32)
    C = DTYPE_BYTES[pm.autocast] if pm.autocast else None
    adapters = _memo(cache, (m, sc.model, sc.peft), (sc.load.dtype, sc.runtime.bitsandbytes_version),
                     lambda: torch_adapters(sc, m))
    target = sc.train.target_len
    split = {"seq_len": sc.train.seq_len, "micro_batch": sc.train.micro_batch, "dtype_bytes": D,
             "gradient_checkpointing": ckpt, "attention": sc.train.attention, "compute_bytes": C,
             "adapters": adapters, "kernels": sc.accelerator, "target_len": target, "float16": fp16}
    act_objs = (sc.model.arch, sc.peft, adapters)
    act_key = tuple(v for k, v in split.items() if k != "adapters")
    est = _memo(cache, act_objs, ("est", *act_key),
                lambda: estimate_activation_bytes(sc.model.arch, sc.peft, **split))
    n_st = m.stages
    stages = [Stage() for _ in range(n_st)]
    blocks = n_st - 2
    arch = sc.model.arch
    t_tok = sc.train.micro_batch * (sc.train.seq_len + sc.peft.prompt_tokens)
    layer_in = D * t_tok * arch.hidden_size
    # an encoder-decoder's blocks differ (the decoder's run at target_len tokens, with cross-attention):
    # each block stage books its own layer's figure; elsewhere every layer but the first is alike
    per_layer = est.per_layer_bytes() if arch.num_encoder_layers else ()
    uneven = len(per_layer) == blocks
    stages[0].act = est.embedding_bytes
    for i in range(1, n_st - 1):
        if uneven:
            stages[i].act = per_layer[i - 1]
            stages[i].recompute = est.recompute_per_layer()[i - 1]
        elif ckpt:
            stages[i].act = layer_in
            stages[i].recompute = est.recompute_bytes
        else:
            stages[i].act = est.first_layer_bytes if i == 1 else est.layer_bytes
    stages[-1].act = est.head_bytes
    # the logits' own dtype: 16-bit when the head's matmul runs in 16 bits (autocast, a pure 16-bit
    # model, FSDP's param_dtype), even where the residual stream is fp32
    # the logits: one row per decoder token (an encoder-decoder's target_len)
    tV = (sc.train.micro_batch * target if arch.num_encoder_layers and target else t_tok) * arch.vocab_size
    fsdp_mp = sc.framework in ("fsdp", "fsdp2") and sc.fsdp.mixed_precision != "none"
    head_w = next((p for p in m.params if p.stage == n_st - 1 and len(p.shape) == 2 and not p.quantized), None)
    LD = 2 if (pm.autocast or fsdp_mp or (head_w is not None and head_w.elem_bytes == 2)) else 4
    loss_fwd: tuple[int, ...] = ()
    loss_bwd: tuple[int, ...] = ()
    if est.logits_bytes and est.loss_forward_bytes >= 4 * tV:  # a language-model head with ForCausalLMLoss
        if LD < D and est.logits_kept_bytes == D * tV:  # the logits kept with the outputs are 16-bit, not
            stages[-1].act -= (D - LD) * tV  # the stream's dtype (where the estimate did not say so itself)
        labels = est.loss_forward_bytes - 4 * tV
        loss_fwd = ((4 * tV,) if LD != 4 else ()) + ((labels,) if labels else ())  # logits.float() copies 16-bit only
    dropped = saved = logits_grad = 0
    # The same autograd sequence on every accelerator: checked against real runs on the CPU
    # (tests/replay/test_torch_plan_vs_replay.py, the live gloo worlds) and against torch's MemTracker on
    # the real model code for CUDA plans (benchmarks/bench_tracker_runs.py, issue 26's table). On the
    # published GPU runs (benchmarks/accuracy.py) it takes the GPU median from 8.5% to 7.0%; the runs
    # that move further off already over-predict elsewhere (bloomz-7b1 LoRA +4.4% -> +5.9%).
    if (est.logits_bytes and est.loss_saved_bytes == 4 * tV
            and est.loss_backward_tensors == (4 * tV, 4 * tV)):
        # ForCausalLMLoss's backward (autograd, in order): nll_loss's gradient (fp32, zeros then
        # scattered) and log_softmax's backward result (fp32) next to its saved result, the step's
        # peak in a 16-bit model; then both of those die but the result, which ToCopyBackward0 casts to
        # the logits' dtype for 16-bit logits. The logits kept with the outputs are gone by then.
        loss_bwd = est.loss_backward_tensors
        dropped = (est.logits_kept_bytes - (D - LD) * tV if LD < D and est.logits_kept_bytes == D * tV
                   else est.logits_kept_bytes)
        saved = est.loss_saved_bytes
        logits_grad = LD * tV if LD != 4 else 0
        # the final norm's output (the stream's dtype) lives until the model's forward returns, through
        # the loss; it is lm_head's saved input only when lm_head trains on it uncast
        head_trains = (head_w.trainable if head_w is not None else
                       any(p.name == m.tied_embedding and p.trainable for p in m.params))
        if not head_trains or (pm.autocast and D == 4):
            loss_fwd = (*loss_fwd, D * t_tok * arch.hidden_size)
    if ckpt:
        held = est.total_bytes - est.embedding_bytes - est.head_bytes - sum(
            stages[i].act for i in range(1, n_st - 1))
        stages[-1].act += max(held, 0)  # the eager causal mask, kept with the head
    at = _memo(cache, act_objs, ("split", *act_key), lambda: split_estimate(est, sc.model.arch, sc.peft, **split))
    _split_stages(stages, est, at, head_extra=stages[-1].act - est.head_bytes)
    if dropped:
        stages[-1].outputs = (dropped,)
        if not ckpt:  # the cache's k and v (model outputs) that no kernel keeps die with the outputs
            bare = _memo(cache, act_objs, ("bare", *act_key),
                         lambda: estimate_activation_bytes(sc.model.arch, sc.peft, keep_outputs=False, **split))
            at_bare = _memo(cache, act_objs, ("bare-split", *act_key),
                            lambda: split_estimate(bare, sc.model.arch, sc.peft, keep_outputs=False, **split))
            for k, st in enumerate(stages[1:-1]):
                kept, left = (est.first_layer_bytes, bare.first_layer_bytes) if k == 0 else (est.layer_bytes,
                                                                                            bare.layer_bytes)
                if kept > left:
                    st.outputs = _removed(at.layers[k] if k < len(at.layers) else (),
                                          at_bare.layers[k] if k < len(at_bare.layers) else (), kept - left)
    act_formula = est.formula
    if traced is not None:
        ts = traced_stages(traced, [p.name for p in m.params], [p.stage for p in m.params], n_st)
        for st, kept in zip(stages, ts.kept):
            st.act, st.act_tensors, st.outputs = kept, (), ()
        stages[ts.temporary_stage].transient = ts.temporary
        loss_fwd = loss_bwd = ()  # in the trace's figures
        saved = logits_grad = 0
        act_formula = (f"traced forward peak: {' + '.join(f'{n:,}' for n in ts.kept)} B kept by the {n_st} stages "
                       f"(embeddings, blocks, head), {ts.temporary:,} B temporaries while stage {ts.temporary_stage} "
                       "runs" + ("; recompute analytic" if ckpt else ""))
    # an adapted input embedding (LoRA's lora_embedding_A/B, HiRA's, trainable tokens) makes the first block's
    # input need a gradient as a trained one does
    grad_into_first = sc.peft.method == "full" or sc.peft.prompt_tokens > 0 or any(
        p.trainable and p.stage == 0 and not p.adapter for p in m.params) or ckpt or (
        adapters is not None and adapters.embedding_trains)
    parallel = arch.model_type in _PARALLEL
    auto = pm.autocast
    for p in m.params:
        st = stages[p.stage]
        if p.trainable:
            if p.name == m.tied_embedding:
                stages[-1].trained.append(p)  # the head's matmul makes its gradient first
                st.second_grads.append(p)
            else:
                st.trained.append(p)
        if p.name == m.tied_embedding and auto and p.dtype != auto:
            # the head's F.linear under autocast casts the tied embedding (a trained fp32 leaf: cached)
            stages[-1].casts.append((p.numel * 2, True, p.trainable and p.dtype == "fp32"))
        leaf = _leaf(p)
        needs_in = grad_into_first or p.stage != 1 or not (leaf in _INPUT_PROJ or (parallel and leaf in _MLP_IN))
        if p.quantized:
            st.quant.append(p)
            st.quant_needs_grad_in.append(needs_in)
            continue
        if not (auto and p.linear and p.dtype != auto and p.dtype != "fp64"):
            continue
        # the cast weight is saved for the input's gradient (grad_in = grad_out @ W); a bias's cast is
        # never saved (its gradient is a sum of grad_out), though autocast caches a trained one
        is_bias = p.name.endswith(".bias")
        st.casts.append((p.numel * 2, needs_in and not is_bias, p.trainable and p.dtype == "fp32"))
    return StepContext(sc=sc, m=m, opt=opt, sink=sink, stages=stages, act_formula=act_formula, tokens=t_tok,
                       groups=trainer_groups(m.params, split=sc.torch.trainer_param_groups),
                       loss_forward=loss_fwd, loss_backward=loss_bwd, loss_saved=saved,
                       logits_grad=logits_grad, stream_bytes=D, logits_bytes=LD, traced=traced is not None)


def _removed(full: tuple[int, ...], bare: tuple[int, ...], total: int) -> tuple[int, ...]:
    """The tensors of ``full`` that ``bare`` lacks (a multiset difference), if they make ``total``;
    else one tensor of ``total``."""
    rest = list(full)
    for n in bare:
        if n not in rest:
            return (total,)
        rest.remove(n)
    return tuple(rest) if rest and sum(rest) == total else (total,)


def _split_stages(stages: list[Stage], est, at: ActivationTensors, *, head_extra: int) -> None:  # noqa: ANN001
    """Each stage's activations (and recompute) as their tensors, where they add up to what the stage
    books (a stage whose figure this recipe adjusted, e.g. 16-bit logits in an fp32 stream, stays one
    tensor unless the adjustment is a tensor of its own)."""
    def fits(parts: tuple[int, ...], total: int) -> tuple[int, ...]:
        return parts if parts and sum(parts) == total else ()

    stages[0].act_tensors = fits(at.embedding, stages[0].act)
    for k, st in enumerate(stages[1:-1]):
        if k < len(at.layers):
            st.act_tensors = fits(at.layers[k], st.act)
        if st.recompute and k < len(at.recompute):
            st.recompute_tensors = fits(at.recompute[k], st.recompute)
    head = (*at.head_rest, est.logits_kept_bytes + min(head_extra, 0), est.loss_saved_bytes, max(head_extra, 0))
    stages[-1].act_tensors = fits(tuple(n for n in head if n > 0), stages[-1].act)
