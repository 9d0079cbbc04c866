"""Activation bytes per layer of LayerNorm decoders (GPT-NeoX, Falcon), BERT-style encoders
(BERT, RoBERTa, DeBERTa-v2) and T5-style encoder-decoders (T5, mT5, umT5).

Counted tensor by tensor from each modeling file (transformers 5), as ``families`` does
for the Llama-style decoders; see there for the shared conventions. ``nn.LayerNorm`` keeps its input
(D h) and an fp32 mean and rstd per token (8 bytes: CUDA's ``native_layer_norm`` returns them in
fp32; the CPU fake kernel the trace runs returns them in the input dtype, 4 bytes less per token).
Dropout in training keeps a 1-byte mask per element (CUDA's fused ``native_dropout``).
"""

from __future__ import annotations

from memfit.core.activations.families import Ctx, sdpa_kernel_bytes
from memfit.core.model import ArchSpec, LayerLayout

_LN = 8
"""Bytes per token of a LayerNorm's fp32 mean and rstd."""


def _drop(p: float, elements: int) -> int:
    """A dropout's 1-byte mask (nothing when the probability is 0)."""
    return elements if p > 0 else 0


def _mlp_act(act: str, D: int, n: int) -> int:
    """What an MLP's activation keeps beyond its own input, for ``n`` elements: its output is kept
    by the next Linear and, for ``gelu_new`` (tanh formula in elementwise ops), three more tensors."""
    return D * n * (4 if act == "gelu_new" else 1)


def neox_layer(arch: ArchSpec, L: LayerLayout, c: Ctx, *, grad_in: bool) -> int:
    """GPT-NeoX and Falcon (modeling_gpt_neox.py, modeling_falcon.py): LayerNorm, fused qkv."""
    D, t, b, s, h, a, hq, hkv, i = c.D, c.t, c.b, c.s, c.h, c.a, c.hq, c.hkv, c.i
    falcon = arch.model_type == "falcon"
    n = D * t * h + _LN * t if grad_in else 0  # the layer input and the first LayerNorm's statistics
    n += D * t * h  # first LayerNorm's output (query_key_value's input)
    # second LayerNorm: NeoX's post_attention_layernorm, Falcon's ln_mlp (new architecture) or its
    # post-attention norm (sequential blocks, which also keep the residual sum)
    if not falcon or L.two_norms_parallel:
        n += _LN * t + D * t * h
    elif not L.parallel:
        n += 2 * D * t * h + _LN * t
    if c.eager:
        from memfit.core.activations.common import _attention_bytes

        n += _attention_bytes(D=D, b=b, s=s, skv=s, t=t, hq=hq, hkv=hkv, a=a, eager=True, gqa=hkv != hq,
                              repeat_kv=True, upcast_qk=False, softmax_bytes=4 if not falcon else D)
    elif falcon and hkv < hq and not L.two_norms_parallel and arch.num_kv_heads == 1:
        # Falcon-7B's multi-query attention: one key head broadcast to all query heads, which no
        # fused CUDA kernel takes: sdpa runs its math kernel (scaled q and k, the probabilities)
        # (matmul broadcasts the single key head: with b > 1 it expands and copies k and v to every head)
        n += D * b * a * s * s + b * s * s  # probabilities, the bool mask
        if b == 1:  # scaled q and k, v, the output's copy for dense, the cache's k (an output)
            n += 2 * D * t * hq + 2 * D * t * hkv + (D * t * hkv if c.cache else 0)
        else:  # q, k and v expanded to every head, the output's copy; the cache's k and v (outputs)
            n += 4 * D * t * hq + (2 * D * t * hkv if c.cache else 0)
    else:
        masked = falcon  # Falcon passes its causal mask to sdpa explicitly
        kernel, _ = sdpa_kernel_bytes(c, masked=masked, heads=a, d_qk=arch.head_dim, d_v=arch.head_dim, s=s, skv=s)
        kv_width = hq if falcon else hkv  # the new architecture broadcasts k, v to every head first
        n += D * t * hq + kernel + D * t * hq + 2 * D * t * kv_width
        n += 0 if falcon else D * t * hq  # NeoX's q is built by a cat: o_proj gets a copy of the output
    n += D * t * i + _mlp_act(L.act, D, t * i)  # dense_h_to_4h output (the activation's input), activation
    n += _drop(L.hidden_dropout, t * h)  # dropout on the block's output before the residual add
    return n


def bert_layer(arch: ArchSpec, L: LayerLayout, c: Ctx, *, grad_in: bool) -> int:
    """BERT, RoBERTa, DeBERTa-v2 (post-LayerNorm encoder layers with dropout)."""
    D, t, b, s, h, a, i = c.D, c.t, c.b, c.s, c.h, c.a, c.i
    p, pa = L.hidden_dropout, L.attention_dropout
    n = D * t * h if grad_in else 0  # the layer input (q, k, v's input and the residual)
    if L.relative_attention == "deberta":
        n += _deberta_attention(arch, L, c)
    elif c.eager:
        n += 3 * D * t * h + D * b * a * s * s + D * t * h  # q, k, v; probabilities; merged heads
        n += _drop(pa, b * a * s * s) + (D * b * a * s * s if pa > 0 else 0)
    else:
        kernel, _ = sdpa_kernel_bytes(c, masked=False, heads=a, d_qk=arch.head_dim, d_v=arch.head_dim, s=s, skv=s)
        n += 3 * D * t * h + kernel + D * t * h  # q, k, v; the kernel's state; the output
    # attention output: dense, dropout, residual add, LayerNorm (input, statistics, output)
    n += _drop(p, t * h) + D * t * h + _LN * t + D * t * h
    n += D * t * i + _mlp_act(L.act, D, t * i)  # intermediate dense output, activation
    n += _drop(p, t * h) + D * t * h + _LN * t  # output dropout, residual sum, LayerNorm
    return n


def _deberta_attention(arch: ArchSpec, L: LayerLayout, c: Ctx) -> int:
    """DeBERTa-v2's disentangled attention (eager only): content-to-position and position-to-content
    scores over ``2 x att_span`` relative positions, gathered per query/key."""
    D, t, b, s, h, a = c.D, c.t, c.b, c.s, c.h, c.a
    span2 = 2 * L.position_buckets
    n = 5 * D * t * h  # q, k, v in head layout, the scaled query, the merged heads
    n += 2 * D * b * a * s * span2  # c2p and p2c scores before the gather
    n += 2 * 8 * s * s  # the two gather index tensors (int64, shared by the batch)
    n += D * b * a * s * s + b * s * s  # probabilities, the bool mask
    n += _drop(L.attention_dropout, b * a * s * s) + (D * b * a * s * s if L.attention_dropout > 0 else 0)
    n += 2 * D * b * a * span2 * (h // a)  # pos_key/pos_query layers repeated for batch x heads
    if L.hidden_dropout > 0:  # pos_dropout of the shared relative embeddings, in every layer
        n += span2 * h + D * span2 * h
    return n


def t5_encoder_layer(arch: ArchSpec, L: LayerLayout, c: Ctx, *, own_bias: bool) -> int:
    """A T5 encoder block: self-attention with the relative position bias, then the feed-forward."""
    D, t, s, h, hq = c.D, c.t, c.s, c.h, c.hq
    n = 2 * (D * t * h + _t5_norm(c))  # two residual inputs, kept by their T5LayerNorms
    n += 3 * D * t * hq + _t5_attention(L, c, s, s, bias=True)  # q, k, v; the kernel or the scores
    n += 8 * s * s if own_bias else 0  # this block's bucket indices (the bias embedding's input)
    n += _drop(L.hidden_dropout, t * h) + _t5_ff(arch, L, c) + _drop(L.hidden_dropout, t * h)
    return n


def t5_decoder_layer(arch: ArchSpec, L: LayerLayout, c: Ctx, *, s_enc: int, own_bias: bool, cross_bias: bool) -> int:
    """A T5 decoder block: causal self-attention (bias + causal mask), cross-attention, FF."""
    D, t, b, s, h, hq = c.D, c.t, c.b, c.s, c.h, c.hq
    n = 3 * (D * t * h + _t5_norm(c))
    n += D * t * hq + 2 * D * t * hq + _t5_attention(L, c, s, s, bias=True)  # self: q, the cache's k and v
    n += s * s if not c.eager else 0  # sdpa: the causal mask sdpa_attention builds next to the bias
    n += 8 * s * s if own_bias else 0
    n += D * t * hq + 2 * D * b * s_enc * hq + _t5_attention(L, c, s, s_enc, bias=cross_bias)  # cross-attention
    n += 2 * _drop(L.hidden_dropout, t * h) + _t5_ff(arch, L, c) + _drop(L.hidden_dropout, t * h)
    return n


def _t5_norm(c: Ctx) -> int:
    """T5LayerNorm beyond its input: fp32 copy, rsqrt, the dtype cast the weight keeps, its output."""
    return 4 * c.t * c.h + 4 * c.t + 2 * c.D * c.t * c.h


def _t5_attention(L: LayerLayout, c: Ctx, s: int, skv: int, *, bias: bool) -> int:
    """sdpa gets the bias as a float mask: the memory-efficient kernel keeps it (per layer), the
    output and a padded logsumexp. eager (T5Attention): softmax in the dtype, dropout (mask and
    output), the merged heads; the bias is added, not kept."""
    D, b, a, hq = c.D, c.b, c.a, c.hq
    if c.eager:
        p = L.attention_dropout
        return D * b * a * s * skv + (b * a * s * skv + D * b * a * s * skv if p > 0 else 0) + D * b * s * hq
    n = D * b * s * hq + 4 * b * a * ((s + 31) // 32 * 32) + 16
    return n + (D * a * s * skv if bias else 0)


def t5_held_biases(arch: ArchSpec, c: Ctx, s_dec: int) -> int:
    """Under checkpointing, the biases T5 and mT5 compute in block 0 and hand to every later block
    are held for the recomputes: the encoder's, the decoder's (causal) and the cross-attention's."""
    if arch.model_type == "umt5":  # every block computes its own
        return 0
    D, a, s = c.D, c.a, c.s
    return D * a * s * s + (D * a * s_dec * s_dec + D * a * s_dec * s if arch.num_encoder_layers else 0)


def _t5_ff(arch: ArchSpec, L: LayerLayout, c: Ctx) -> int:
    """T5's DenseReluDense (``wi``/``wo``) or gated (``wi_0``, ``wi_1``, ``wo``), with its dropout."""
    D, t, i = c.D, c.t, c.i
    drop = _drop(L.hidden_dropout, t * i)
    if L.gated:  # wi_0 output, the activation's tensors, wi_1 output, dropout mask and output
        return D * t * i + _mlp_act(L.act, D, t * i) + D * t * i + drop + D * t * i
    return D * t * i + drop + D * t * i  # relu's output (it keeps its result), dropout mask and output
