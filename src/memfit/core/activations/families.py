"""Activation bytes per layer of the families described by a ``LayerLayout`` (pure arithmetic).

``memfit.core.activations.analytic.estimate_activation_bytes`` calls these for architectures whose builder
set ``ArchSpec.layout``; each function counts, tensor by tensor, what the family's transformers 5
code keeps for backward in one layer, as the trace of that code finds it
(tests/trace/test_family_activations.py compares them at two sequence lengths for every family).
Sizes per token unless said otherwise; ``D`` is the training dtype's element size, ``t = b x s``.

Shared pieces, each read from the modeling code:

- RMSNorm, Llama style (``weight * x.to(dtype)``): an fp32 copy of the input (4 h) and the rsqrt
  (4 per token) when the input needs a gradient, the dtype copy (D h) when the weight trains; its
  output (D h) is kept by the next Linear when that trains. Gemma style (``x * (1 + weight)`` in
  fp32): the fp32 copy, the rsqrt, the fp32 normed tensor (4 h) when the weight trains and the
  ``1 + weight`` vector (4 h per norm); OLMo2 style (``weight * x`` in fp32): the same without it.
- Attention (sdpa, as CUDA dispatches it; ``memfit.trace.cuda_kernels``): the rotated q (D hq), the
  cache's k and v (D hkv each: kept by the kernel, or model outputs when the kernel gets repeated
  copies), the output (D hq) and an fp32 logsumexp: ``(b, heads, s)`` for flash (no mask, one head
  width <= 256), padded to 32 queries for the memory-efficient kernel, which also keeps the mask as
  a dtype bias ``(b, s, s_kv)`` per layer and needs k, v repeated to all heads (D hq each) — which
  is what transformers does when a mask exists (``use_gqa_in_sdpa``). ``eager`` keeps the score
  matrices (``memfit.core.activations.common._attention_bytes``).
- MLP (SwiGLU/GeGLU): gate output, its activation, up output and their product (4 D i).
- Mixture of experts, grouped_mm (transformers/integrations/moe.py ``grouped_mm_experts_forward``):
  the router's fp32 probabilities (4 E) and top-k indices (8 k), and per routed (token, expert):
  the gathered input (D h), gate_up output (2 D i), activation (D i), product (D i), down output
  (D h), the routing weight, and the sort permutation, its quotient and inverse (3 x 8 bytes).
"""

from __future__ import annotations

from memfit.core.model import ArchSpec, LayerLayout


class Ctx:
    """One call's numbers (a plain class: the recommender calls this >10k times per second)."""

    __slots__ = ("D", "b", "s", "skv", "t", "h", "a", "hq", "hkv", "kv", "i", "eager", "full", "trains",
                 "cache", "gqa", "attention", "qk_grads")

    def __init__(self, **kw) -> None:
        for k, v in kw.items():
            setattr(self, k, v)


def ceil32(n: int) -> int:
    """The memory-efficient kernel's logsumexp rows: queries rounded up to a multiple of 32."""
    return -(-n // 32) * 32


def norm_bytes(style: str, c: Ctx, *, grad_in: bool, weight_trains: bool, out_kept: bool) -> int:
    """One RMSNorm over the hidden width (see the module docstring)."""
    D, t, h = c.D, c.t, c.h
    n = 0
    if grad_in:
        n += 4 * t * h + 4 * t
        if style == "rms_gemma":
            n += 4 * h  # the 1 + weight vector the product keeps
    if weight_trains:
        n += D * t * h if style == "rms" else 4 * t * h
    if out_kept:
        n += D * t * h
    return n


def sdpa_kernel_bytes(c: Ctx, *, masked: bool, heads: int, d_qk: int, d_v: int, s: int, skv: int) -> tuple[int, bool]:
    """``(bytes the fused kernel keeps besides q, k, v and the output, repeat)``: the logsumexp, the
    RNG state and the mask bias; ``repeat`` when transformers repeats k, v to all heads first."""
    b, D = c.b, c.D
    flash = not masked and d_qk == d_v and d_qk <= 256 and d_qk % 8 == 0 and D in (2,)
    if flash:
        return 4 * b * heads * s + 24, False
    n = 4 * b * heads * ceil32(s) + 16
    if masked:
        n += D * b * s * skv
    return n, masked


def llama_layer(arch: ArchSpec, L: LayerLayout, c: Ctx, *, grad_in: bool, moe: bool, masked: bool,
                qk_norm: bool) -> int:
    """One decoder layer of a Llama-style family (llama.py's ``_VARIANTS``)."""
    D, t, b, s, skv, h, a, hq, hkv = c.D, c.t, c.b, c.s, c.skv, c.h, c.a, c.hq, c.hkv
    trains, full = c.trains, c.full
    style = L.norm
    post = L.norms == "post"
    n = 0
    # --- attention input: a pre-norm's output, or (OLMo2) the residual stream itself
    if post:
        n += D * t * h if trains("q_proj", "k_proj", "v_proj") else 0
    else:
        n += norm_bytes(style, c, grad_in=grad_in, weight_trains=full,
                        out_kept=trains("q_proj", "k_proj", "v_proj", "qkv_proj", "q_a_proj", "kv_a_proj_with_mqa"))
    if L.mla:
        n += _mla_bytes(arch, L, c)
    else:
        n += _attention(arch, L, c, masked=masked, qk_norm=qk_norm, grad_in=grad_in)
    # --- after attention, then the MLP's input
    mlp_in_kept = trains("gate_proj", "up_proj", "gate_up_proj") or moe
    if L.norms == "sandwich":  # Gemma 2/3: post_attention_layernorm (to the residual), pre_feedforward_layernorm
        n += norm_bytes(style, c, grad_in=True, weight_trains=full, out_kept=False)
        n += norm_bytes(style, c, grad_in=True, weight_trains=full, out_kept=mlp_in_kept)
    elif post:  # OLMo2: post_attention_layernorm, then the residual sum feeds the MLP
        n += norm_bytes("rms_olmo2", c, grad_in=True, weight_trains=full, out_kept=False)
        n += D * t * h if mlp_in_kept else 0
    else:
        n += norm_bytes(style, c, grad_in=True, weight_trains=full, out_kept=mlp_in_kept)
    if moe:
        n += _moe_bytes(arch, L, c)
    else:
        i = L.dense_intermediate_size if (L.dense_layers and L.dense_intermediate_size) else arch.intermediate_size
        n += 3 * D * t * i + (D * t * i if trains("down_proj") else 0)
    if L.norms == "sandwich":
        n += norm_bytes(style, c, grad_in=True, weight_trains=full, out_kept=False)  # post_feedforward_layernorm
    elif post:
        n += norm_bytes("rms_olmo2", c, grad_in=True, weight_trains=full, out_kept=False)  # post_feedforward
    return n


def _attention(arch: ArchSpec, L: LayerLayout, c: Ctx, *, masked: bool, qk_norm: bool, grad_in: bool) -> int:
    """q, k, v, the kernel and the output projection's input of a grouped-query attention."""
    D, t, b, s, skv, a, hq, hkv = c.D, c.t, c.b, c.s, c.skv, c.a, c.hq, c.hkv
    kv = c.kv
    full = c.full
    n = 0
    if qk_norm and L.qk_norm == "head":
        n += 4 * t * (hq + hkv) + 4 * t * (a + kv)
        if full:
            n += (D if L.norm == "rms" else 4) * t * (hq + hkv)
        if L.norm == "rms_gemma":
            n += 2 * 4 * arch.head_dim
    elif qk_norm and L.qk_norm == "full":
        n += 4 * t * (hq + hkv) + 8 * t + (4 * t * (hq + hkv) if full else 0)
    elif qk_norm and L.qk_norm == "l2":
        n += 4 * t * (hq + hkv) + 4 * t * (a + kv)
    if c.eager:
        from memfit.core.activations.common import _attention_bytes

        n += _attention_bytes(D=D, b=b, s=s, skv=skv, t=t, hq=hq, hkv=hkv, a=a, eager=True, gqa=c.gqa,
                              repeat_kv=True, upcast_qk=False, softmax_bytes=4)
        if L.attn_softcap:
            n += D * b * a * s * skv  # tanh output of the soft-capped scores
        n += 2 * D * b * skv * hkv if c.cache and c.gqa else 0  # the cache (outputs) besides the repeats
        if not c.trains("o_proj"):  # the merged heads are a copy only o_proj's input needs
            n -= D * t * hq
        if not grad_in:  # the score matmul keeps k for q's gradient and q for k's; in the first layer
            n -= D * t * hq * (2 - getattr(c, "qk_grads", 1))  # only the adapted ones need one
        return n
    kernel, repeat = sdpa_kernel_bytes(c, masked=masked, heads=a, d_qk=arch.head_dim, d_v=arch.head_dim, s=s, skv=skv)
    n += D * t * hq + kernel + D * t * hq  # q, kernel state, output
    if repeat and c.gqa:
        n += 2 * D * b * skv * hq + (2 * D * b * skv * hkv if c.cache else 0)
    else:
        n += 2 * D * b * skv * (hq if repeat else hkv)
    if L.fused_qkv:
        n += D * t * hq  # q built by a cat: the output is transposed back into a copy for o_proj
    return n


def _mla_bytes(arch: ArchSpec, L: LayerLayout, c: Ctx) -> int:
    """DeepSeek-V3 multi-head latent attention (modeling_deepseek_v3.DeepseekV3Attention)."""
    D, t, b, s, a = c.D, c.t, c.b, c.s, c.a
    q_rank, kv_rank, nope, rope, v = L.mla
    qk = nope + rope
    n = 0
    if q_rank:
        n += 4 * t * q_rank + 4 * t + (D * t * q_rank if c.full else 0) + D * t * q_rank  # q_a_layernorm
    n += D * t * a * qk  # query = cat(q_pass, rotated q_rot)
    n += 4 * t * kv_rank + 4 * t + (D * t * kv_rank if c.full else 0)  # kv_a_layernorm
    n += D * t * kv_rank + D * t * rope  # the cached latent (kv_b_proj's input) and rotated k_rot
    n += D * t * a * (nope + v)  # kv_b_proj output: k_nope and the values (views)
    n += D * t * a * qk  # key_states, assembled in a new tensor
    kernel, _ = sdpa_kernel_bytes(c, masked=False, heads=a, d_qk=qk, d_v=v, s=s, skv=s)
    if c.eager:
        kernel = 4 * b * a * s * s + D * b * a * s * s
    n += kernel + D * t * a * v
    return n


def _moe_bytes(arch: ArchSpec, L: LayerLayout, c: Ctx) -> int:
    """A mixture-of-experts feed-forward (see the module docstring); Llama 4 runs every expert."""
    D, t, h = c.D, c.t, c.h
    E, k, i = arch.num_experts, arch.experts_per_token, arch.intermediate_size
    n = 0
    if L.moe_kind == "llama4":
        n += 4 * t * E + 8 * t * k  # sigmoid scores (fp32), top-k indices
        n += 2 * D * t * E * h + D * t * E  # repeated and scaled inputs, the scores column
        n += 4 * D * t * E * i  # gate_up output, activation, product
    else:
        fp32_router = bool(L.mla) or L.router_renorm  # the weights stay fp32 when renormalised
        n += 4 * t * E + 8 * t * k
        if L.mla:  # DeepSeek: sigmoid router in fp32 on an fp32 copy of the input and weight
            n += 4 * t * h + 4 * E * h + 4 * t + 4 * t * k
        elif L.router_renorm:
            n += 4 * t * k + 4 * t  # renormalised top-k weights and their sum
        weight = 4 if fp32_router else D
        tk = t * k
        n += D * tk * (2 * h + 4 * i) + tk * (weight + 24) + 4 * E
    if L.shared_expert_size:
        si = L.shared_expert_size
        n += 4 * D * t * si
        if L.shared_expert_gate:
            n += D * t * h + D * t  # shared expert's output and its sigmoid gate
    return n
