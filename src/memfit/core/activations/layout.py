"""``estimate_activation_bytes`` for architectures with a ``LayerLayout``: groups of layers, the
embeddings, the task's head, the logits and the loss, as each family's transformers code keeps them.

Layer formulas are in ``families`` (Llama-style decoders, experts, latent attention) and
``stacks`` (NeoX/Falcon, BERT/DeBERTa, T5). Heads (transformers 5):

- causal / masked / seq2seq LM: the head's input (D h, when its weight trains), the logits
  (D V per token, kept with the outputs) and the loss: ``ForCausalLMLoss``/``ForMaskedLMLoss``
  upcast the logits to fp32 and keep the fp32 log-softmax (4 V); BERT's and T5's heads call
  ``CrossEntropyLoss`` on the dtype logits (a D V log-softmax); BERT's masked-LM head adds its
  transform (dense, activation, LayerNorm);
- sequence classification: ``score`` on every position (D labels per token), then one row per
  sequence; BERT-style: a pooler on the first token;
- token classification: a dropout (mask and output) before ``score``/``classifier``, fp32 loss;
- question answering: ``qa_outputs`` (2 per token), start and end logits split into copies.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import NamedTuple

from memfit.core.activations.adapters import (PRE_ATTENTION_NORMS, AdapterActivations, first_block_adapters,
                                              first_block_input_trains)
from memfit.core.activations.common import CAUSAL_LM_LOSS, _lora_targets
from memfit.core.activations.estimate import ActivationEstimate, LayerGroup
from memfit.core.activations.families import Ctx, lin_in, llama_layer, norm_bytes
from memfit.core.activations.kernels import BY_NAME
from memfit.core.activations.stacks import bert_layer, neox_layer, t5_decoder_layer, t5_encoder_layer, t5_held_biases
from memfit.core.model import ArchSpec
from memfit.core.peft.spec import PeftSpec

_LM_TASKS = ("causal-lm", "masked-lm", "seq2seq-lm")


def estimate_from_layout(
    arch: ArchSpec, peft: PeftSpec, *, seq_len: int, micro_batch: int, dtype_bytes: int,
    gradient_checkpointing: bool, attention: str, keep_outputs: bool, linear_saves_frozen_inputs: bool,
    target_len: int | None, compute_bytes: int | None = None, adapters: AdapterActivations | None = None,
    kernels: str = "cuda", float16: bool = False, first_input_grad: bool | None = None,
) -> ActivationEstimate:
    L = arch.layout
    method = peft.method
    D, b = dtype_bytes, micro_batch
    C = compute_bytes or D
    s = seq_len + peft.prompt_tokens
    skv = s + peft.prefix_tokens
    t = b * s
    full = method in ("full", "freeze")
    targets = (adapters.kept_inputs(D) if adapters is not None else
               _lora_targets(arch, peft) if method == "lora" else ())
    frozen_saves = linear_saves_frozen_inputs

    def trains(*names: str) -> bool:
        return full or frozen_saves or any(n in targets for n in names)

    # the first block's layers whose outputs need a gradient over frozen embeddings: the adapted ones
    # (all of them behind an adapted pre-attention norm, LN tuning)
    first_adapted = adapters.first_block_adapted() if adapters is not None else frozenset(targets)
    behind_norm = bool(first_adapted & PRE_ATTENTION_NORMS)

    def adapted(*names: str) -> bool:
        return full or behind_norm or any(n in first_adapted for n in names)

    head_c = C
    if adapters is not None and adapters.quantized is not None:
        # a bitsandbytes base: its layers return their input's dtype whatever autocast does (bitsandbytes
        # nn/modules.py Linear4bit.forward: matmul_4bit(...).to(inp_dtype); autograd/_functions.py
        # MatMul8bitLt: int8_mm_dequant(..., dtype=A.dtype)); the head (not quantized) still runs in C
        C = D
    c = Ctx(D=D, C=C, amp=C != D, b=b, s=s, skv=skv, t=t, h=arch.hidden_size, a=arch.num_heads, hq=arch.num_heads * arch.head_dim,
            hkv=arch.num_kv_heads * arch.head_dim, kv=arch.num_kv_heads, i=arch.intermediate_size,
            eager=attention == "eager", full=full, trains=trains, adapted=adapted,
            # the cache lives on only as part of the outputs that carry it (CausalLMOutputWithPast,
            # SequenceClassifierOutputWithPast, Seq2SeqLMOutput); transformers disables it under checkpointing
            cache=keep_outputs and not gradient_checkpointing and arch.task in ("causal-lm", "sequence-classification", "seq2seq-lm")
            and (adapters is None or adapters.kv_cache),
            gqa=arch.num_kv_heads != arch.num_heads,
            attention=attention, r=peft.lora_r if method == "lora" else 0, kernels=kernels,
            float16=float16)
    grad_first = full or first_block_input_trains(peft, adapters)  # prompt tokens, a trained embedding
    if first_input_grad is not None:  # a side network's blocks (analytic._with_side): every weight trains
        grad_first = first_input_grad
    # decoder tokens: the target's (peft 0.21's PeftModelForSeq2SeqLM.forward prepends prompt tuning's
    # virtual tokens to the encoder's inputs only, whatever num_transformer_submodules says)
    s_dec = target_len or seq_len
    lora = (max(adapters.block_bytes(t, D, samples=b), default=0) if adapters is not None else
            len(targets) * C * t * peft.lora_r if method == "lora" else 0)  # each lora_A's output
    lora_first = first_block_adapters(adapters, arch, t, D, grad_first, samples=b) if adapters is not None else lora
    fused = attention != "eager" and attention != "sdpa"  # flash/flex take windows without a mask

    groups: list[LayerGroup] = []
    first = 0
    extra = ""
    if L.family == "llama":
        kinds = L.layer_kinds or ("d",) * arch.num_layers
        counted = Counter(kinds)
        for kind in dict.fromkeys(kinds):  # execution order of first appearance
            ck = c
            if "s" in kind and skv != s and L.sliding_window > 0:
                # a sliding-window layer's cache keeps only the last window - 1 of the prefix's keys
                # (transformers cache_utils.DynamicSlidingWindowLayer)
                ck = _ctx_copy(c, skv=s + min(skv - s, L.sliding_window - 1))
            # an explicit mask: sliding-window layers longer than their window, prefix tuning's virtual keys
            masked = ("s" in kind and s > L.sliding_window > 0 or skv != s) and not fused and not c.eager
            kw = dict(moe="m" in kind, masked=masked, qk_norm="n" not in kind)
            groups.append(LayerGroup(_kind_name(kind), counted[kind], llama_layer(arch, L, ck, grad_in=True, **kw) + lora))
            if kind == kinds[0]:
                first = llama_layer(arch, L, ck, grad_in=grad_first, **kw) + lora_first
    elif L.family == "neox":
        per = neox_layer(arch, L, c, grad_in=True) + lora
        groups.append(LayerGroup("layer", arch.num_layers, per))
        first = neox_layer(arch, L, c, grad_in=grad_first) + lora_first
    elif L.family == "bert":
        per = bert_layer(arch, L, c, grad_in=True) + lora
        groups.append(LayerGroup("layer", arch.num_layers, per))
        first = bert_layer(arch, L, c, grad_in=grad_first) + lora_first
    elif L.family == "t5":
        if adapters is not None:  # decoder blocks at target length (cross-attention's k, v over the encoder's)
            lora_first, lora, dec_adapters = _t5_adapter_bytes(adapters, arch, D, t, b * s_dec, grad_first, b)
        else:
            dec_adapters = None
        groups, first, extra = _t5_groups(arch, c, s_dec, lora, grad_first=grad_first, lora_first=lora_first,
                                          dec_adapters=dec_adapters)
    else:  # a layout family without a model here is a builder bug
        raise AssertionError(L.family)

    t_out = b * s_dec if L.family == "t5" and arch.num_encoder_layers else t
    # the input embedding's weight trains (its backward then saves the token ids it gathered)
    embed_trains = full or (adapters.embedding_trains if adapters is not None else
                            peft.prompt_tokens == 0 and first_block_input_trains(peft, None))
    embed = _embedding_bytes(arch, c, grad_first or gradient_checkpointing,
                             leaf=gradient_checkpointing and not grad_first, embed_trains=embed_trains,
                             t_dec=b * s_dec)
    if gradient_checkpointing and peft.prompt_tokens and not embed_trains:
        # prompt learning (prompt tuning, P-tuning, multitask prompts) under checkpointing: peft embeds the real
        # tokens with the model's own input embedding (peft_model.py PeftModelForCausalLM/Seq2SeqLM.forward:
        # self.word_embeddings(input_ids)), the module transformers' enable_input_require_grads hooks
        # (modeling_utils.py, from _activation_checkpointing_enable), so its output is a leaf that requires grad,
        # held by its AccumulateGrad node until backward; the virtual tokens are concatenated after it
        embed += D * b * seq_len * arch.hidden_size
    hd = _head_bytes(arch, c if head_c == C else _ctx_copy(c, C=head_c, amp=head_c != D), t_out,
                     keep_outputs=keep_outputs, checkpointing=gradient_checkpointing)
    head, logits = hd.head, hd.logits
    if adapters is not None:  # adapted (or quantized) embeddings and heads, outside the blocks
        before, after = adapters.outside_bytes(t, D, samples=b)
        embed, head = embed + before, head + after
    layers_total = sum(g.count * g.bytes for g in groups) - (groups[0].bytes - first if groups else 0)
    n_layers = sum(g.count for g in groups)
    biggest = max(groups, key=lambda g: g.count * g.bytes) if groups else LayerGroup("layer", 0, 0)
    held = 0
    if gradient_checkpointing:
        # each layer keeps only its input (non-reentrant checkpoint); the backward recomputes one
        held = n_layers * D * t * arch.hidden_size
        if L.family == "t5":
            if arch.num_encoder_layers:  # decoder blocks hold their input at target_len tokens
                held += arch.num_layers * D * b * (s_dec - s) * arch.hidden_size
            held += t5_held_biases(arch, c, s_dec)
        held += _held_masks(arch, c)
        total = held + embed + head
        recompute = max(g.bytes for g in groups) if groups else 0
        formula = (f"checkpointed: {n_layers} layers x input {D}*{t}*{arch.hidden_size} + embeddings {embed:,} + "
                   f"head {head:,} (recompute one layer {recompute:,} B in backward)")
    else:
        total = layers_total + embed + head
        recompute = 0
        parts = " + ".join(f"{g.count} x {g.bytes:,} ({g.name})" for g in groups)
        formula = (f"{arch.model_type} {arch.task} {method} {attention}: first layer {first:,}; {parts} B "
                   f"(b={b}, s={s}, h={arch.hidden_size}, {D} B){extra} + embeddings {embed:,} + head {head:,}")
    if kernels != "cuda":  # the kernel set, and what it still plans as CUDA runs it
        formula += f" ({kernels} kernels for sdpa; still as CUDA runs them: {'; '.join(BY_NAME[kernels].unmodelled)})"
    return ActivationEstimate(
        total_bytes=total, layer_bytes=biggest.bytes, first_layer_bytes=first, embedding_bytes=embed,
        head_bytes=head, logits_bytes=logits, recompute_bytes=recompute, formula=formula, layers=tuple(groups),
        checkpointed_layer_bytes=D * t * arch.hidden_size if gradient_checkpointing else 0,
        checkpointed_layers=_held_layers(arch, c, groups, s_dec) if gradient_checkpointing else (),
        logits_kept_bytes=hd.kept, loss_saved_bytes=hd.saved, loss_forward_tensors=hd.forward,
        loss_backward_tensors=hd.backward, logits_grad_bytes=hd.grad, loss_source=hd.source,
    )


def _held_layers(arch: ArchSpec, c: Ctx, groups: list[LayerGroup], s_dec: int) -> tuple[int, ...]:
    """Checkpointing: what each layer holds, in order (``ActivationEstimate.checkpointed_layers``):
    its input (a decoder block's at ``s_dec`` tokens); the first layer also the masks every layer
    receives, and in T5/mT5 the first encoder (decoder) block the position biases it computes and
    hands to the others."""
    L = arch.layout
    D, b, h = c.D, c.b, arch.hidden_size
    enc = D * c.t * h
    out = [enc] * sum(g.count for g in groups)
    if not out:
        return ()
    out[0] += _held_masks(arch, c)
    if L.family == "t5" and arch.num_encoder_layers:
        n_enc = arch.num_encoder_layers
        for k in range(n_enc, len(out)):
            out[k] = D * b * s_dec * h
        if arch.model_type != "umt5":
            a = c.a
            out[0] += D * a * c.s * c.s  # the encoder's bias (t5_held_biases)
            out[n_enc] += D * a * s_dec * s_dec + c.C * a * s_dec * c.s  # the decoder's self and cross biases
    elif L.family == "t5":
        out[0] += t5_held_biases(arch, c, s_dec)
    return tuple(out)


def _held_masks(arch: ArchSpec, c: Ctx) -> int:
    """Masks the layers receive as inputs, held with them under checkpointing: eager attention's
    causal mask (a dtype bias, masking_utils.eager_mask), sdpa's sliding-window or Falcon's explicit
    one (bool)."""
    L = arch.layout
    b, s, skv = c.b, c.s, c.skv
    if L.family == "llama":
        pos = 8 * s  # the position ids every layer receives (an arange made in the model's forward)
        if c.eager:  # one per attention type (Gemma 2/3: the full and the sliding-window mask)
            return pos + c.D * b * s * skv * (len({"s" in k for k in L.layer_kinds}) if L.layer_kinds else 1)
        sliding = any("s" in k for k in L.layer_kinds) and s > L.sliding_window > 0 and c.attention == "sdpa"
        return pos + (b * s * skv if sliding else 0)
    if L.relative_attention == "deberta":  # the encoder hands every layer the relative positions (int64),
        # the fp32 attention mask and the LayerNorm'd relative embeddings (their statistics when they train)
        span2 = 2 * L.position_buckets
        return 8 * s * s + 4 * b * s * s + c.D * span2 * c.h + (8 * span2 if c.full else 0)
    if L.family == "neox":  # the position ids (an arange); Falcon's explicit causal mask: create_causal_mask
        # with allow_is_causal_skip=False (transformers 5.24.0 and 5.25.0 modeling_falcon.py), bool for sdpa,
        # eager's a dtype bias (masking_utils.eager_mask), as Llama's
        if arch.model_type != "falcon":
            return 8 * s
        return 8 * s + (c.D * b * s * skv if c.eager else b * s * s)
    return 0


def _kind_name(kind: str) -> str:
    name = "moe" if "m" in kind else "dense"
    return name + (" sliding" if "s" in kind else "") + (" nope" if "n" in kind else "")


def _t5_adapter_bytes(adapters: AdapterActivations, arch: ArchSpec, D: int, t_enc: int, t_dec: int,
                      grad_first: bool, b: int) -> tuple[int, int, int]:
    """The adapters' (and quantized matmuls') bytes of an encoder-decoder, ``b`` sequences: (first encoder block,
    largest encoder block, largest decoder block), decoder layers at the target's tokens except the
    cross-attention's k and v, which read the encoder's output."""
    n_enc = arch.num_encoder_layers if arch.num_encoder_layers else arch.num_layers
    per_enc = adapters.block_bytes(t_enc, D, samples=b)[:n_enc]
    first = first_block_adapters(adapters, arch, t_enc, D, grad_first, samples=b)
    dec = [0] * max(adapters.blocks - n_enc, 0)
    rows = [(x.module, x.block, adapters.saved(x, D)) for x in adapters.layers]
    if adapters.quantized is not None:
        rows += [(q.module, q.block, adapters.quantized.saved(q, D)) for q in adapters.quantized.layers]
    for module, block, saved in rows:
        if n_enc <= block < adapters.blocks:
            tokens = t_enc if re.search(r"EncDecAttention\.[kv]$", module) else t_dec
            dec[block - n_enc] += saved.bytes(tokens, b)
    return first, max(per_enc, default=0), max(dec, default=0)


def _t5_groups(arch: ArchSpec, c: Ctx, target_len: int, lora: int, *, grad_first: bool, lora_first: int | None = None,
               dec_adapters: int | None = None) -> tuple[list[LayerGroup], int, str]:
    """Encoder blocks at ``seq_len`` and decoder blocks at ``target_len`` tokens per sequence (the
    first of each over frozen embeddings keeps nothing for its input: ``grad_first``)."""
    L = arch.layout
    every = arch.model_type == "umt5"  # every umT5 block has its own relative bias
    enc_n = arch.num_encoder_layers if arch.num_encoder_layers else arch.num_layers
    enc = t5_encoder_layer(arch, L, c, own_bias=every) + lora
    enc0 = t5_encoder_layer(arch, L, c, own_bias=True, grad_in=grad_first) + (lora if lora_first is None else lora_first)
    groups = [LayerGroup("encoder", enc_n, enc)]
    if not arch.num_encoder_layers:  # T5ForTokenClassification: the encoder alone
        return groups, enc0, ""
    s_enc = c.s
    dec_c = Ctx(**{k: getattr(c, k) for k in Ctx.__slots__})
    dec_c.s = dec_c.skv = target_len
    dec_c.t = c.b * target_len
    # lora_A's outputs: the decoder's self-attention and feed-forward at target_len tokens, the
    # cross-attention's k and v projections over the encoder's output
    dec_lora = dec_adapters or 0
    if dec_adapters is None and c.r and not c.full:
        names = ("q", "k", "v", "o", "wi", "wi_0", "wi_1", "wo")
        dec_lora = sum(c.C * dec_c.t * c.r for n in names if c.trains(n))  # self-attention and FF
        dec_lora += sum(c.C * (c.t if n in ("k", "v") else dec_c.t) * c.r for n in ("q", "k", "v", "o") if c.trains(n))
    dec = t5_decoder_layer(arch, L, dec_c, s_enc=s_enc, own_bias=every, cross_bias=every) + dec_lora
    dec0 = t5_decoder_layer(arch, L, dec_c, s_enc=s_enc, own_bias=True, cross_bias=True,
                            grad_in=c.full) + dec_lora  # prompt tuning's tokens reach the encoder alone
    extra = ""
    if dec0 != dec:  # the first decoder block computes the biases T5 and mT5 share with the others
        groups += [LayerGroup("decoder (first)", 1, dec0), LayerGroup("decoder", arch.num_layers - 1, dec)]
        extra = f"; first decoder block {dec0:,}"
    else:
        groups.append(LayerGroup("decoder", arch.num_layers, dec))
    return groups, enc0, extra


def _embedding_bytes(arch: ArchSpec, c: Ctx, grad_in: bool, *, leaf: bool = False, embed_trains: bool = False,
                     t_dec: int = 0) -> int:
    """Rotary tables, embedding dropout and the like (before the first layer). ``leaf``: checkpointing
    over frozen embeddings, where ``enable_input_require_grads`` makes the word embeddings' output a
    leaf that requires grad (its AccumulateGrad node holds it until backward). ``embed_trains``: the
    input embedding's weight trains; ``t_dec``: an encoder-decoder's decoder tokens."""
    L = arch.layout
    D, t, s, h = c.D, c.t, c.s, c.h
    if L.family == "llama":
        if L.moe_kind == "llama4":
            return 4 * s * arch.head_dim  # complex64 frequencies (s x head_dim / 2 x 8 B)
        rot = L.mla[3] if L.mla else L.rotary_dim or arch.head_dim
        types = 1
        if L.sliding_layers and L.layer_kinds and arch.model_type == "gemma3_text":
            types = len({"s" in k for k in L.layer_kinds})
        return 2 * s * rot * (4 if L.rotary_fp32 else D) * types  # cos and sin, per rotary table
    if L.family == "neox":  # (the embedding output is layer 0's input, counted with the layer)
        return 2 * s * L.rotary_dim * D if L.rotary_dim else 0
    if L.family == "bert":
        # embeddings' sum and LayerNorm (input, statistics), its dropout mask (its output is layer 0's
        # input), the gathered token types; RoBERTa's position ids made from the input ids
        n = (D * t * h + 8 * t + (t * h if L.hidden_dropout > 0 else 0)) if grad_in else 0
        if L.relative_attention == "deberta":  # no token types, no absolute positions (the LayerNorm's input
            return n + (D * t if grad_in else 0)  # is the word embeddings' output); the mask multiplied in
        n += D * t * h if leaf else 0  # the word embeddings' output, before their sum and LayerNorm
        return n + ((16 if arch.model_type == "roberta" else 8) * t if c.full else 0)
    if L.family == "t5":  # embedding dropout masks (their outputs are block 0's inputs, counted there)
        n = t * h if L.hidden_dropout > 0 and grad_in else 0
        n += D * t * h if leaf else 0  # the encoder's embed_tokens output (the decoder's: with the head)
        if arch.num_encoder_layers and embed_trains:
            # decoder_input_ids (the labels shifted right, int64): the embedding's backward saves the ids
            # only when its weight needs a gradient (derivatives.yaml embedding: indices for weight's grad)
            n += 8 * t_dec
        return n
    return 0


class _Head(NamedTuple):
    """A task head's bytes: ``head`` (everything it keeps for backward and with the outputs, logits
    included), ``logits`` (the logits, kept and saved copies), ``kept`` (the logits the outputs hold),
    ``saved`` (the log-softmax the loss saves), the loss's forward and backward transients as the
    tensors the code makes, the logits' gradient cast back to the training dtype, and the loss code."""

    head: int
    logits: int
    kept: int
    saved: int = 0
    forward: tuple[int, ...] = ()
    backward: tuple[int, ...] = ()
    grad: int = 0
    source: str = ""


_LOSS_FILE = "transformers/loss/loss_utils.py"
_UPCAST_LOSS = {
    "causal-lm": CAUSAL_LM_LOSS,
    "masked-lm": f"{_LOSS_FILE}:ForMaskedLMLoss (logits.float(); fixed_cross_entropy -> log_softmax + nll_loss) "
                 "(transformers 5.24)",
    "seq2seq-lm": f"{_LOSS_FILE}:ForCausalLMLoss (LOSS_MAPPING['ForConditionalGeneration']) (transformers 5.24)",
}
_DTYPE_LOSS = {  # model_type -> the head's CrossEntropyLoss on the dtype logits (log_softmax + nll_loss)
    "bert": "transformers/models/bert/modeling_bert.py:BertForMaskedLM.forward (CrossEntropyLoss)",
    "roberta": "transformers/models/roberta/modeling_roberta.py:RobertaForMaskedLM.forward (CrossEntropyLoss)",
    "deberta-v2": "transformers/models/deberta_v2/modeling_deberta_v2.py:DebertaV2ForMaskedLM.forward (CrossEntropyLoss)",
    "t5": "transformers/models/t5/modeling_t5.py:T5ForConditionalGeneration.forward (CrossEntropyLoss)",
    "mt5": "transformers/models/mt5/modeling_mt5.py:MT5ForConditionalGeneration.forward (CrossEntropyLoss)",
    "umt5": "transformers/models/umt5/modeling_umt5.py:UMT5ForConditionalGeneration.forward (CrossEntropyLoss)",
}
_TOKEN_LOSS = f"{_LOSS_FILE}:ForTokenClassification (logits.float(); fixed_cross_entropy) (transformers 5.24)"


def _head_bytes(arch: ArchSpec, c: Ctx, t_out: int, *, keep_outputs: bool, checkpointing: bool = False) -> _Head:
    """The head's and the loss's bytes for the task (see ``_Head``); ``checkpointing``: gradient
    checkpointing is on (an encoder-decoder's decoder embeddings then need a gradient)."""
    L = arch.layout
    D, C, h, V = c.D, c.C, c.h, arch.vocab_size
    task = arch.task
    t = t_out
    # the stack's last output feeds the head's first Linear directly, except a token classifier's
    # dropout (which keeps its mask and output instead) and BERT-style heads that start elsewhere
    head_trains = c.full and task != "token-classification"
    head_in = (C if c.amp else D) * t * h if head_trains else 0  # under AMP the head's own 16-bit copy
    n = 0
    # the stack's final norm (its output feeds the head)
    if L.family == "llama":
        n += norm_bytes(L.norm, _ctx_at(c, t), grad_in=True, weight_trains=c.full, out_kept=False) + head_in
    elif L.family == "neox":
        n += D * t * h + 8 * t + head_in  # ln_f input, statistics, its output (or autocast's copy of it)
    elif L.family == "t5":
        from memfit.core.activations.stacks import _t5_norm

        # final T5LayerNorm, dropout (mask, and its output: the head's input, unless a token classifier's
        # own dropout follows)
        drop = t * h if L.hidden_dropout > 0 else 0
        n += _t5_norm(_ctx_at(c, t)) + drop + (head_in if task != "token-classification" else 0)
        if arch.num_encoder_layers:
            te = c.t  # the encoder's own final norm and dropout; its output is every cross-attention's k
            # and v projections' input (under AMP each makes its own copy, counted with the decoder)
            n += _t5_norm(c) + (te * h if L.hidden_dropout > 0 else 0)
            # (the outputs hold it too: Seq2SeqLMOutput.encoder_last_hidden_state)
            n += D * te * h if keep_outputs or (not c.amp and c.trains("k", "v")) else 0
            # the decoder's embedding output needs a gradient when the embeddings train, and under
            # checkpointing over frozen ones: enable_input_require_grads hooks every stack's embed_tokens
            # (transformers modeling_utils.py PreTrainedModel.enable_input_require_grads, called by
            # _activation_checkpointing_enable), so the decoder's embedding dropout keeps its mask, and the
            # hook's requires_grad_ makes the output a leaf its AccumulateGrad node holds until backward
            n += t * h if L.hidden_dropout > 0 and (c.full or checkpointing) else 0
            n += D * t * h if checkpointing and not c.full else 0
    elif L.family == "bert" and task in _LM_TASKS:
        n += lin_in(c, t * h, "dense")  # the last layer's output: the transform dense's input
    elif L.family == "bert" and task != "token-classification" and not _roberta_head(arch) and not (
            c.amp and L.pooler and task == "sequence-classification"):
        # the last layer's output: the head's input (the pooler's first-token view keeps it all); under AMP
        # qa_outputs saves autocast's 16-bit copy of it instead (nothing else saves the fp32 output)
        n += (C if c.amp and task == "question-answering" else D) * t * h
    if task in _LM_TASKS:
        if L.family == "bert":  # transform: dense output, the activation's output (the LayerNorm's input,
            # autocast's fp32 copy of it under AMP), LayerNorm statistics, its output (the decoder's input)
            n += C * t * h + (4 if c.amp else C) * t * h + 8 * t + lin_in(c, t * h, "decoder")
        upcast = L.loss_upcast and L.family not in ("bert", "t5")
        tV = t * V
        log_softmax = (4 if upcast else C) * tV
        if not upcast and c.amp:  # CUDA autocast: nll_loss (fp32 list) saves an fp32 copy of the log-probs
            log_softmax += 4 * tV
        logits = (C * tV if keep_outputs else 0) + log_softmax  # the logits are a matmul's output
        if L.logit_softcap:
            logits += C * tV  # tanh of logits / cap, kept for its backward
        if task == "causal-lm":
            n += 8 * (t + c.b)  # the labels padded by one (ForCausalLMLoss), kept by the shift
        kept = C * tV if keep_outputs else 0
        if upcast:  # logits.float() (a copy of 16-bit logits), then the label copies; nll_loss's and
            # log_softmax's gradients (fp32), cast back to the logits' dtype (none for fp32 logits)
            fwd = ((4 * tV,) if C != 4 else ()) + (8 * t,)
            bwd, grad = (4 * tV, 4 * tV), (C * tV if C != 4 else 0)
            source = _UPCAST_LOSS[task]
        elif c.amp:  # nll_loss's gradient of the fp32 copy, next to both saved tensors; then the casts back
            fwd, bwd, grad = (8 * t,), (4 * tV,), C * tV
            source = _DTYPE_LOSS.get(arch.model_type, "the model's CrossEntropyLoss on the dtype logits") + \
                " under CUDA autocast (log_softmax in the logits' dtype, nll_loss on an fp32 copy: aten LossNLL.cpp " \
                "cross_entropy_loss_symint) (transformers 5.24, torch 2.13)"
        else:  # CrossEntropyLoss on the dtype logits: log_softmax's backward result is their gradient; the
            # 1-D int64 target (labels.view(-1)) is read in place (aten cross_entropy_loss -> log_softmax +
            # nll_loss_forward: no copy of a contiguous target), so nothing else lives while the loss runs
            fwd, bwd, grad = (), (C * tV, C * tV), 0
            source = _DTYPE_LOSS.get(arch.model_type, "the model's CrossEntropyLoss on the dtype logits") + \
                " (transformers 5.24)"
        return _Head(n + logits, logits, kept, log_softmax, fwd, bwd, grad, source)
    labels = arch.num_labels
    if task == "sequence-classification":
        if _roberta_head(arch):
            # RobertaClassificationHead: dropout of features[:, 0] (its mask; the first-token view is not
            # saved, so the stack's output is freed), dense on its output (autocast's 16-bit copy under
            # AMP), tanh's output, dropout (mask, output: out_proj's input)
            E = C if c.amp else D
            n += 2 * c.b * h + 3 * E * c.b * h
            return _Head(n + D * c.b * labels + 4 * c.b * labels, D * c.b * labels, D * c.b * labels)
        if L.pooler and c.amp:
            # BertPooler under autocast: its dense saves a 16-bit copy of features[:, 0] (not the view, so
            # the stack's output is freed), tanh's output; the classifier's dropout (mask, output)
            n += 3 * C * c.b * h + (c.b * h if L.classifier_dropout > 0 else 0)
            return _Head(n + D * c.b * labels + 4 * c.b * labels, D * c.b * labels, D * c.b * labels)
        if L.family == "bert" or L.pooler:
            n += D * c.b * h * 2  # first token (pooler input), tanh output
            return _Head(n + D * c.b * labels + 4 * c.b * labels, D * c.b * labels, D * c.b * labels)
        if L.family == "t5":
            n += 3 * D * c.b * h  # eos representation, dense output, tanh output
            return _Head(n + D * c.b * labels, D * c.b * labels, D * c.b * labels)
        n += D * t * labels  # score on every position; the pooled rows are small
        return _Head(n, D * t * labels, D * t * labels)
    if task == "token-classification":
        E = C if c.amp else D  # under AMP the classifier saves autocast's 16-bit copy of its input
        if L.classifier_dropout > 0:
            n += t * h + E * t * h  # dropout mask and output (the classifier's input)
        else:
            n += E * t * h  # the stack's output itself
        logits = D * t * labels + 4 * t * labels
        return _Head(n + logits, logits, D * t * labels, 4 * t * labels, (4 * t * labels,),
                     (4 * t * labels, 4 * t * labels), D * t * labels, _TOKEN_LOSS)
    # question answering: qa_outputs on the stack's output (counted above), start/end copies
    logits = D * t * labels + 2 * D * t
    return _Head(n + logits, logits, logits)


def _roberta_head(arch: ArchSpec) -> bool:
    """RoBERTa's sequence classifier (roberta/modeling_roberta.py RobertaClassificationHead): a dropout
    before its dense, so the first token's view of the stack's output is not what the dense saves."""
    L = arch.layout
    return (arch.task == "sequence-classification" and L.family == "bert" and not L.pooler
            and L.classifier_dropout > 0)


def _ctx_copy(c: Ctx, **changes) -> Ctx:
    other = Ctx(**{k: getattr(c, k) for k in Ctx.__slots__})
    for k, v in changes.items():
        setattr(other, k, v)
    return other


def _ctx_at(c: Ctx, t: int) -> Ctx:
    if t == c.t:
        return c
    other = Ctx(**{k: getattr(c, k) for k in Ctx.__slots__})
    other.t = t
    return other
