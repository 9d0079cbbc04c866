"""Fast analytic model of activation memory: the bytes a training step keeps for backward.

Pure Python arithmetic over ``ArchSpec`` and ``PeftSpec`` (microseconds per call), for the
recommender's searches; ``memfit.trace`` measures the same quantity exactly from the model code,
and tests/core/test_activations.py checks this model against it over a grid of families, PEFT
methods, sequence lengths, attention kernels and checkpointing.

It starts from Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models", section 4.1: ``sbh(34 + 5as/h)`` bytes per layer for fp16 GPT with dropout) but counts
each tensor autograd really keeps, storage by storage, as the transformers implementations of each
family produce them:

- A Linear layer keeps its *input* only to compute its *weight's* gradient: ``mm`` saves ``self``
  when ``mat2`` requires grad (torch/csrc/autograd/FunctionsManual.cpp, derivatives.yaml ``mm``).
  A frozen Linear still passes gradients back through its weight, but saves no input; so LoRA and
  prefix tuning drop most Linear inputs, while DeepSpeed ZeRO-3's ``LinearFunctionForZeroStage3``
  saves them anyway (``linear_saves_frozen_inputs``).
- Tensors shared by several consumers count once (the normed input of q, k, v and the MLP).
- Nothing before the first op that needs a gradient is saved: with frozen embeddings (LoRA,
  prefix) the first layer's input norm keeps nothing; an adapted or trained input embedding (LoRA on
  ``embed_tokens``, ``modules_to_save``, trainable tokens) is not frozen (``first_block_input_trains``).
- Prefix tuning lengthens keys and values by ``P`` virtual tokens in every layer and backpropagates
  through all of them; prompt tuning lengthens the whole sequence.
- LoRA keeps the ``r``-wide output of ``lora_A`` per adapted layer (its input is the base layer's,
  counted once).
- Attention: ``eager`` keeps the score matrices (fp32 softmax in GPT-J and Llama, the dtype in
  GPT-2, plus GPT-2's attention-dropout mask and output); ``sdpa`` (flash / memory-efficient
  kernels) keeps q, k, v, the output and an fp32 logsumexp per head and query.
- Gated MLPs (SwiGLU) keep gate, its activation and up (and their product when ``down_proj``
  trains); GELU-tanh MLPs (GPT-J, GPT-2 ``gelu_new``) keep four intermediates of the MLP width.
- Mixture of experts: each token's MLP terms times ``experts_per_token``, plus fp32 router logits.
- Gradient checkpointing (non-reentrant, transformers' default): each layer keeps only its input;
  the backward recomputes one layer at a time (``recompute_bytes`` on top).
- The loss: the logits in the training dtype (kept with the outputs), and the fp32 log-softmax
  ``ForCausalLMLoss`` saves (transformers/loss/loss_utils.py upcasts the logits).
- Dropout keeps a 1-byte mask per element (CUDA's fused ``native_dropout``).

Bytes are per GPU; ``dtype_bytes`` is the training dtype's element size.
"""

from __future__ import annotations

from dataclasses import replace

from memfit.core.activations.adapters import (AdapterActivations, SideModel, first_block_adapters,
                                              first_block_input_trains, first_block_qk_grads)
from memfit.core.activations.common import CAUSAL_LM_LOSS, _attention_bytes, _lora_targets
from memfit.core.activations.estimate import ActivationEstimate, LayerGroup
from memfit.core.activations.kernels import KERNEL_SETS
from memfit.core.families.attention import IMPLEMENTATIONS
from memfit.core.model import ArchSpec
from memfit.core.peft.spec import PeftSpec
from memfit.errors import MemfitError

_FAMILY = {"gptj": "gptj", "gpt2": "gpt2", "llama": "llama", "mistral": "llama", "qwen2": "llama",
           "qwen3": "llama", "gemma": "llama", "mixtral": "llama"}
_GPTJ_ROTARY_FRACTION = 4
"""GPT-J rotates ``rotary_dim`` = head_dim / 4 of each head (64 of 256 in GPT-J 6B); ``ArchSpec``
does not carry ``rotary_dim``."""
_GELU_TANH_INTERMEDIATES = 4
"""``gelu_new`` = 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))) keeps x, tanh(·), 1 + tanh(·) and 0.5·x."""


def estimate_activation_bytes(
    arch: ArchSpec,
    peft: PeftSpec,
    *,
    seq_len: int,
    micro_batch: int,
    dtype_bytes: int,
    gradient_checkpointing: bool = False,
    attention: str = "sdpa",
    keep_outputs: bool = True,
    linear_saves_frozen_inputs: bool = False,
    target_len: int | None = None,
    compute_bytes: int | None = None,
    adapters: AdapterActivations | None = None,
    kernels: str = "cuda",
    float16: bool = False,
) -> ActivationEstimate:
    """Activation bytes of one micro-batch of ``micro_batch`` x ``seq_len`` tokens (see module doc).

    ``attention``: an ``attn_implementation`` (``memfit.core.families.attention.IMPLEMENTATIONS``);
    every one but ``eager`` keeps the fused kernels' tensors. ``target_len``: decoder tokens of an
    encoder-decoder (default ``seq_len``). ``dtype_bytes`` is the residual stream's element size (the
    model's dtype); ``compute_bytes`` the matmul outputs' (autocast's 16-bit dtype under AMP on an
    fp32 model; default ``dtype_bytes``). ``adapters``: what the PEFT method's adapted layers keep
    (``memfit.core.activations.adapters``; without it, LoRA is counted from ``peft`` alone).
    ``kernels``: the accelerator's kernel set (``memfit.core.activations.kernels``: ``cuda``, or ``cpu``
    for ``accelerator: cpu``; the CPU's are planned for ``LayerLayout`` families, CUDA's elsewhere,
    which the formula says). ``float16``: the residual stream is float16, not bfloat16 (a pure fp16
    model; ``dtype_bytes`` 2): T5-style blocks then clamp their hidden states (``stacks._t5_clamp``).
    """
    if seq_len < 1 or micro_batch < 1 or dtype_bytes < 1:
        raise MemfitError(f"seq_len, micro_batch and dtype_bytes must be >= 1, got {seq_len}, {micro_batch}, {dtype_bytes}")
    if attention not in IMPLEMENTATIONS:
        raise MemfitError(f"attention must be one of {', '.join(IMPLEMENTATIONS)}, got {attention!r}")
    if target_len is not None and target_len < 1:
        raise MemfitError(f"target_len must be >= 1, got {target_len}")
    if compute_bytes is not None and compute_bytes not in (2, 4):
        raise MemfitError(f"compute_bytes must be 2 or 4, got {compute_bytes}")
    if kernels not in KERNEL_SETS:
        raise MemfitError(f"kernels must be one of {', '.join(KERNEL_SETS)}, got {kernels!r}")
    if float16 and dtype_bytes != 2:
        raise MemfitError(f"float16 says the residual stream is 2-byte float16, got dtype_bytes {dtype_bytes}")
    est = _estimate(arch, peft, seq_len=seq_len, micro_batch=micro_batch, dtype_bytes=dtype_bytes,
                    gradient_checkpointing=gradient_checkpointing, attention=attention, keep_outputs=keep_outputs,
                    linear_saves_frozen_inputs=linear_saves_frozen_inputs, target_len=target_len,
                    compute_bytes=compute_bytes, adapters=adapters, kernels=kernels, float16=float16)
    side = adapters.side if adapters is not None else None
    if side is None:
        return est
    if gradient_checkpointing and side.wraps_blocks:  # the blocks' adapters: outside the checkpoints
        kept = sum(adapters.block_bytes(micro_batch * seq_len, dtype_bytes, samples=micro_batch))
        if side.feeds_blocks and side.base_embedding_frozen:  # the frozen embedding's leaf
            kept += dtype_bytes * micro_batch * seq_len * arch.hidden_size
        est = replace(est, total_bytes=est.total_bytes + kept,
                      formula=f"{est.formula} + the adapters around the checkpointed blocks {kept:,} B")
    return _with_side(est, side, seq_len=seq_len, micro_batch=micro_batch, dtype_bytes=dtype_bytes,
                      attention=attention, linear_saves_frozen_inputs=linear_saves_frozen_inputs,
                      compute_bytes=compute_bytes, kernels=kernels, float16=float16,
                      gradient_checkpointing=gradient_checkpointing, keep_outputs=keep_outputs)


def _with_side(est: ActivationEstimate, side: SideModel, *, seq_len: int, micro_batch: int, dtype_bytes: int,
               attention: str, linear_saves_frozen_inputs: bool, compute_bytes: int | None, kernels: str,
               float16: bool, gradient_checkpointing: bool = False, keep_outputs: bool = True) -> ActivationEstimate:
    """``est`` with a tuner's side network's blocks (``SideModel``: SHADOW's backbone) counted before the
    model's blocks, as the same model plans any network's blocks, every weight trained; not checkpointed (the
    model's ``gradient_checkpointing_enable`` does not reach it). Under checkpointing transformers'
    ``enable_input_require_grads`` hook makes every output of the input embedding require grad, the one the side
    network reads too: its first block's input then trains, and that output is a leaf held until backward. Its
    key/value cache is kept with the outputs as the model's is (SHADOW: ``_compute_initial_shadow_state`` runs the
    backbone with the config's ``use_cache``, and the ShadowCache holds it), checkpointed or not (the backbone's own
    forward does not turn it off)."""
    reads_frozen = not side.input_trains
    side_est = _estimate(side.arch, PeftSpec(method="full"), seq_len=seq_len, micro_batch=micro_batch,
                         dtype_bytes=dtype_bytes, gradient_checkpointing=False, attention=attention,
                         keep_outputs=keep_outputs, linear_saves_frozen_inputs=linear_saves_frozen_inputs,
                         compute_bytes=compute_bytes, kernels=kernels, float16=float16,
                         first_input_grad=side.input_trains or gradient_checkpointing)
    t = micro_batch * seq_len
    leaf = dtype_bytes * t * side.arch.hidden_size if gradient_checkpointing and reads_frozen else 0
    head_in = (compute_bytes or dtype_bytes) * t * side.arch.hidden_size  # a trained head's input: it has none
    blocks = side_est.total_bytes - side_est.embedding_bytes - side_est.head_bytes
    norm = side_est.head_bytes - side_est.logits_bytes - head_in
    extra = side_est.embedding_bytes + blocks + norm + leaf  # its own embeddings' (rotary tables) too
    return replace(est, total_bytes=est.total_bytes + extra, embedding_bytes=est.embedding_bytes + extra,
                   formula=f"{est.formula} + side network {extra:,} B (embeddings {side_est.embedding_bytes:,} + "
                           f"{side.arch.num_layers} blocks {blocks:,} + final norm {norm:,}; {side.note})")


def _estimate(
    arch: ArchSpec,
    peft: PeftSpec,
    *,
    seq_len: int,
    micro_batch: int,
    dtype_bytes: int,
    gradient_checkpointing: bool = False,
    attention: str = "sdpa",
    keep_outputs: bool = True,
    linear_saves_frozen_inputs: bool = False,
    target_len: int | None = None,
    compute_bytes: int | None = None,
    adapters: AdapterActivations | None = None,
    kernels: str = "cuda",
    float16: bool = False,
    first_input_grad: bool | None = None,
) -> ActivationEstimate:
    if arch.layout is not None:
        from memfit.core.activations.layout import estimate_from_layout

        return estimate_from_layout(arch, peft, seq_len=seq_len, micro_batch=micro_batch, dtype_bytes=dtype_bytes,
                                    gradient_checkpointing=gradient_checkpointing, attention=attention,
                                    keep_outputs=keep_outputs, linear_saves_frozen_inputs=linear_saves_frozen_inputs,
                                    target_len=target_len, compute_bytes=compute_bytes, adapters=adapters,
                                    kernels=kernels, float16=float16, first_input_grad=first_input_grad)
    method = peft.method
    fam = _FAMILY.get(arch.model_type, "llama" if arch.mlp_kind == "gated" else "gpt2")
    D = dtype_bytes
    b = micro_batch
    s = seq_len + peft.prompt_tokens
    skv = s + peft.prefix_tokens
    t = b * s
    h = arch.hidden_size
    a = arch.num_heads
    hq = a * arch.head_dim
    hkv = arch.num_kv_heads * arch.head_dim
    i = arch.intermediate_size
    k_exp = arch.experts_per_token if arch.num_experts > 1 else 1
    eager = attention == "eager"
    full = method == "full" or method == "freeze"
    targets = (adapters.kept_inputs(D) if adapters is not None else
               _lora_targets(arch, peft) if method == "lora" else ())
    frozen_saves = linear_saves_frozen_inputs and fam != "gpt2"  # GPT-2's Conv1D is not nn.Linear

    def trains(*names: str) -> bool:
        """The input of a Linear among ``names`` is kept: its weight trains (or ZeRO-3 keeps it)."""
        return full or frozen_saves or any(n in targets for n in names)

    lora_r = (max(adapters.block_bytes(t, D, samples=b), default=0) if adapters is not None else
              sum(1 for _ in targets) * D * t * peft.lora_r if method == "lora" else 0)
    grad_into_first = full or first_block_input_trains(peft, adapters)  # prompt tokens, a trained embedding
    if first_input_grad is not None:  # a side network's blocks: every weight trains, its input may not
        grad_into_first = first_input_grad
    qk_grads = first_block_qk_grads(adapters, targets, peft)  # first layer, frozen embeddings
    # transformers turns the cache off under checkpointing; a method may need it off (AdapterActivations.kv_cache)
    cache = keep_outputs and not gradient_checkpointing and (adapters is None or adapters.kv_cache)

    layer = _layer_bytes(fam, D=D, b=b, s=s, skv=skv, t=t, h=h, a=a, hq=hq, hkv=hkv, i=i * k_exp, eager=eager,
                         trains=trains, full=full, grad_in=True, gqa=hkv != hq, cache=cache)
    first = _layer_bytes(fam, D=D, b=b, s=s, skv=skv, t=t, h=h, a=a, hq=hq, hkv=hkv, i=i * k_exp, eager=eager,
                         trains=trains, full=full, grad_in=grad_into_first, gqa=hkv != hq, cache=cache,
                         qk_grads=qk_grads)
    router = t * arch.num_experts * 4 if arch.num_experts > 1 else 0
    layer += lora_r + router
    first += (first_block_adapters(adapters, arch, t, D, grad_into_first, samples=b) if adapters is not None
              else lora_r) + router
    # checkpointing calls enable_input_require_grads(): the embedding output becomes a leaf that
    # requires grad (its AccumulateGrad node holds it until backward)
    embed_grad = grad_into_first or gradient_checkpointing
    embed = _embedding_bytes(fam, D=D, t=t, s=s, h=h, hq=hq, a=a, grad_in=embed_grad)
    if gradient_checkpointing and not grad_into_first and fam == "gpt2":
        embed += D * t * h  # wte output, separate from the (position-added, dropped-out) layer input
    logits = (D * t * arch.vocab_size if keep_outputs else 0) + 4 * t * arch.vocab_size
    head = logits + _head_bytes(fam, D=D, t=t, h=h, lm_head_trains=full)
    if adapters is not None:  # adapted (or quantized) embeddings and heads, outside the blocks
        before, after = adapters.outside_bytes(t, D, samples=b)
        embed, head = embed + before, head + after
    L = arch.num_layers + arch.num_encoder_layers
    if gradient_checkpointing:
        held = L * D * t * h + (D * b * s * skv if eager else 0)  # layer inputs, the eager causal mask
        total = held + embed + head
        recompute = layer
        formula = (f"checkpointed: {L} layers x input {D}*{t}*{h} + embeddings {embed:,} + head {head:,} "
                   f"(recompute one layer {layer:,} B in backward)")
    else:
        total = first + (L - 1) * layer + embed + head
        recompute = 0
        formula = (f"{fam} {method} {attention}: first layer {first:,} + {L - 1} x {layer:,} B per layer "
                   f"(b={b}, s={s}, s_kv={skv}, h={h}, a={a}, i={i}, {D} B) + embeddings {embed:,} + head {head:,}")
    if kernels != "cuda":
        formula += f" (CUDA's kernels: the {kernels} kernel set is planned for LayerLayout families only)"
    V = arch.vocab_size
    return ActivationEstimate(
        total_bytes=total,
        layer_bytes=layer,
        first_layer_bytes=first,
        embedding_bytes=embed,
        head_bytes=head,
        logits_bytes=logits,
        recompute_bytes=recompute,
        formula=formula,
        layers=(LayerGroup("layer", L, layer),),
        checkpointed_layer_bytes=D * t * h if gradient_checkpointing else 0,
        checkpointed_layers=(_held_layers(L, D * t * h, D * b * s * skv if eager else 0)
                             if gradient_checkpointing else ()),
        logits_kept_bytes=D * t * V if keep_outputs else 0,
        loss_saved_bytes=4 * t * V,
        # the fp32 copy of the logits; the labels padded by one and their shifted copy
        loss_forward_tensors=(4 * t * V, 8 * t, 8 * t),
        loss_backward_tensors=(4 * t * V, 4 * t * V),  # nll_loss's gradient, log_softmax's backward result (fp32)
        logits_grad_bytes=D * t * V,
        loss_source=CAUSAL_LM_LOSS,
    )


def _held_layers(n_layers: int, per_layer: int, first_extra: int) -> tuple[int, ...]:
    """Checkpointing: each layer's kept input, the first also holding what every layer receives."""
    if not n_layers:
        return ()
    return (per_layer + first_extra,) + (per_layer,) * (n_layers - 1)


def _layer_bytes(fam: str, *, D: int, b: int, s: int, skv: int, t: int, h: int, a: int, hq: int, hkv: int, i: int,
                 eager: bool, trains, full: bool, grad_in: bool, gqa: bool, cache: bool, qk_grads: int = 1) -> int:
    """One decoder layer's saved bytes, as the family's transformers code produces them. ``qk_grads``: how
    many of q and k need a gradient when the layer's input does not (``grad_in`` false: the adapted ones)."""
    prefix_mask = skv != s
    if fam == "gptj":
        # parallel block: ln_1 feeds attention and the MLP; with a frozen embedding the first
        # layer's MLP sees no tensor that needs a gradient and keeps nothing
        n = (D * t * h + 8 * t) if grad_in else 0  # ln_1 keeps its input and fp32 mean/rstd
        n += D * t * h if trains("q_proj", "k_proj", "v_proj", "fc_in") else 0  # ln_1 output
        n += _attention_bytes(D=D, b=b, s=s, skv=skv, t=t, hq=hq, hkv=hkv, a=a, eager=eager, gqa=gqa,
                              repeat_kv=False, upcast_qk=True, softmax_bytes=4)
        n += 2 * D * b * s * (hq // a // _GPTJ_ROTARY_FRACTION)  # sin/cos repeated for q and k
        n += D * b * s * skv if prefix_mask and not eager else 0
        if eager:
            n += D * b * skv * hkv if cache else 0  # the cache's rotated k (scores use an fp32 copy)
            # first layer with frozen embeddings: only one of q, k needs a gradient, so the score
            # matmul keeps only the other's fp32 copy
            n -= 0 if grad_in else 4 * t * hq
            n -= 0 if trains("out_proj") else D * t * hq  # merged heads are out_proj's input only
        if grad_in:
            n += D * t * i * _GELU_TANH_INTERMEDIATES
            n += D * t * i if trains("fc_out") else 0
        return n
    if fam == "gpt2":
        n = (D * t * h + 8 * t) if grad_in else 0  # ln_1 input, mean/rstd
        n += D * t * h if trains("c_attn") else 0  # ln_1 output
        if eager:
            # q for the score matmul: matmul folds (b, a, s, d) into (b*a, s, d), a view of c_attn's
            # output when b == 1 (which then stays alive whole), a copy of q otherwise
            n += D * t * 3 * h if b == 1 else D * t * h
            n += D * b * skv * h * 2  # k, v (cache cat)
            n += D * b * a * s * skv * 2 + b * a * s * skv  # softmax, dropout output, bool mask
            n += D * t * h if trains("c_proj") else 0  # merged heads
        else:
            n += D * t * 3 * h  # c_attn output: sdpa keeps q, a view of it, and so all of it
            n += 2 * D * b * skv * h + D * t * h + 4 * b * a * s
            n += D * b * s * skv if prefix_mask else 0
        n += t * h  # resid dropout mask
        n += D * t * h + 8 * t  # ln_2 input (residual sum) and stats
        n += D * t * h if trains("c_fc") else 0  # ln_2 output
        n += D * t * i * _GELU_TANH_INTERMEDIATES
        n += D * t * i if trains("c_proj") else 0
        n += t * h  # mlp dropout mask
        return n
    # llama-like: RMSNorm (fp32 upcast), rotary, SwiGLU
    norm = 4 * t * h + 4 * t  # fp32 copy of the input, rsqrt
    norm_out = D * t * h  # the dtype copy the weight multiplies, kept when the weight trains
    n = (norm + (norm_out if full else 0)) if grad_in else 0
    n += D * t * h if trains("q_proj", "k_proj", "v_proj") else 0  # normed input
    repeat = eager or prefix_mask
    n += _attention_bytes(D=D, b=b, s=s, skv=skv, t=t, hq=hq, hkv=hkv, a=a, eager=eager, gqa=gqa,
                          repeat_kv=repeat, upcast_qk=False, softmax_bytes=4)
    if repeat and gqa and (cache or not eager):
        n += 2 * D * b * skv * hkv  # the cache's k, v (attention keeps the repeat_kv copies)
    n += D * b * s * skv if prefix_mask and not eager else 0
    if eager and not trains("o_proj"):
        n -= D * t * hq
    if eager and not grad_in:
        # the score matmul keeps k for q's gradient and q for k's: in the first layer only the adapted ones need one
        n -= D * t * hq * (2 - qk_grads)
    n += norm + (norm_out if full else 0)
    n += D * t * h if trains("gate_proj", "up_proj") else 0
    n += 3 * D * t * i + (D * t * i if trains("down_proj") else 0)
    return n


def _embedding_bytes(fam: str, *, D: int, t: int, s: int, h: int, hq: int, a: int, grad_in: bool) -> int:
    if fam == "gpt2":
        return t * h if grad_in else 0  # embedding dropout mask
    if fam == "llama":
        return 2 * s * (hq // a) * D  # rotary cos/sin
    return 0


def _head_bytes(fam: str, *, D: int, t: int, h: int, lm_head_trains: bool) -> int:
    if fam == "llama":
        n = 4 * t * h + 4 * t + (2 * D * t * h if lm_head_trains else 0)
    else:
        n = D * t * h + 8 * t + (D * t * h if lm_head_trains else 0)
    return n
