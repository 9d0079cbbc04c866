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

from memfit.core.activations.kernels import Sdpa, cpu_sdpa
from memfit.core.model import ArchSpec, LayerLayout

__all__ = ["Ctx", "Sdpa", "lin_in", "llama_layer", "norm_bytes", "sdpa", "sdpa_kernel_bytes"]


class Ctx:
    """One call's numbers (a plain class: the recommender calls this >10k times per second).

    ``D``: element size of the residual stream (the model's dtype: embeddings, norms, residual sums);
    ``C``: of the matmul outputs (autocast's 16-bit dtype under AMP, else ``D``); ``amp`` when they
    differ. ``trains(*names)``: whether any of these Linears keeps its input (its weight trains, or
    ZeRO-3's linear keeps it anyway). ``adapted(*names)``: whether any of these layers' outputs need a
    gradient in the first block over frozen embeddings (full training, an adapter on them, an adapted
    norm before them). ``r``: LoRA's rank (0 without LoRA). ``kernels``: the accelerator's kernel set
    (``memfit.core.activations.kernels``: ``cuda`` or ``cpu``). ``float16``: the residual stream is
    float16 (``D`` 2, not bfloat16)."""

    __slots__ = ("D", "C", "amp", "b", "s", "skv", "t", "h", "a", "hq", "hkv", "kv", "i", "eager", "full", "trains",
                 "adapted", "cache", "gqa", "attention", "r", "kernels", "float16")

    def __init__(self, **kw) -> None:
        for k, v in kw.items():
            setattr(self, k, v)


def lin_in(c: Ctx, elements: int, *names: str) -> int:
    """What the Linears ``names`` keep of an input of ``elements`` elements in the residual stream's
    dtype: one shared tensor when any of them trains; under autocast each trained one saves its own
    16-bit copy (``autocast_mode.cpp:cached_cast`` caches only leaf weights, not activations)."""
    if not names:
        return 0
    if c.amp:
        return sum(c.C * elements for n in names if c.trains(n))
    return c.D * elements if c.trains(*names) else 0


def ceil32(n: int) -> int:
    """The memory-efficient kernel's logsumexp rows: queries rounded up to a multiple of 32."""
    return -(-n // 32) * 32


def norm_bytes(style: str, c: Ctx, *, grad_in: bool, weight_trains: bool, out_kept: bool | int,
               readers: tuple[str, ...] = ()) -> int:
    """One RMSNorm over the hidden width (see the module docstring). Its output, in the stream's
    dtype, is kept by the Linears ``readers`` that train (``lin_in``), or, without ``readers``, once
    when ``out_kept``."""
    D, t, h = c.D, c.t, c.h
    n = 0
    if grad_in:
        n += 4 * t * h + 4 * t
        if style == "rms_gemma":
            n += 4 * h  # the 1 + weight vector the product keeps
    if weight_trains:
        n += D * t * h if style == "rms" else 4 * t * h
    if readers:
        n += lin_in(c, t * h, *readers)
    elif out_kept:
        n += D * t * h
    return n


def sdpa(c: Ctx, *, masked: bool, heads: int, kv_heads: int, d_qk: int, d_v: int, s: int, skv: int,
         gqa_module: bool | None = None, dropout: float = 0.0, bias: int | None = None) -> Sdpa:
    """The kernel CUDA (``c.kernels`` cpu: the CPU, ``kernels.cpu_sdpa``) picks for q, k, v in the compute dtype ``c.C`` (aten/src/ATen/native/transformers/
    cuda/sdp_utils.cpp ``select_sdp_backend``: flash, then memory-efficient, then math; torch 2.13)
    and its saved tensors (``Sdpa``). ``gqa_module``: the module groups query heads (transformers then
    repeats k, v or asks for ``enable_gqa``; default: ``kv_heads != heads``). ``bias``: bytes of the
    additive mask the efficient kernel keeps (default: a bool mask converted per call, ``C b s skv``)."""
    b, K = c.b, c.C
    grouped = kv_heads != heads if gqa_module is None else gqa_module
    if c.attention in ("flash_attention_2", "flash_attention_3"):
        # not torch's sdpa: transformers' flash integration calls flash-attn itself, with the key heads as
        # they are (no repeat) and q, k, v of an fp32 stream cast to a 16-bit dtype first
        # (integrations/flash_attention.py:get_target_dtype: autocast's, a quantized model's config
        # dtype, else its Linears' weights'); the kernel keeps those 16-bit q, k, v, its output and the
        # logsumexp
        return Sdpa("flash", False, 4 * b * heads * s + 24, True, False)
    repeat = grouped and not (not masked and d_qk == d_v <= 256)
    given = heads if repeat else kv_heads
    enable_gqa = grouped and not repeat
    if c.kernels == "cpu":
        return cpu_sdpa(K=K, b=b, heads=heads, kv_heads=kv_heads, d_qk=d_qk, d_v=d_v, s=s, skv=skv, masked=masked,
                        repeat=repeat, enable_gqa=enable_gqa, dropout=dropout, bias=bias)
    low = K == 2
    if not masked and low and d_qk == d_v and d_qk <= 256 and d_qk % 8 == 0 and (given == heads or enable_gqa):
        return Sdpa("flash", repeat, 4 * b * heads * s + 24, True, False)
    align = 8 if low else 4
    if d_qk % align == 0 and d_v % align == 0 and given == heads:
        n = 4 * b * heads * ceil32(s) + 16
        if masked:
            n += K * b * s * skv if bias is None else bias
        return Sdpa("efficient", repeat, n, True, False)
    # math (attention.cpp _scaled_dot_product_attention_math): fp32 q and k scaled, probabilities,
    # dropout's mask and output, v (a repeated or fp32 copy, or v itself)
    n = 4 * b * heads * s * d_qk + 4 * b * heads * skv * d_qk + 4 * b * heads * s * skv
    if dropout > 0:
        n += 5 * b * heads * s * skv
    keeps_v = False
    if enable_gqa and given != heads:
        n += 4 * b * heads * skv * d_v
    elif low:
        n += 4 * b * given * skv * d_v
    else:
        keeps_v = True
    return Sdpa("math", repeat, n, False, keeps_v)


def sdpa_kernel_bytes(c: Ctx, *, masked: bool, heads: int, d_qk: int, d_v: int, s: int, skv: int) -> tuple[int, bool]:
    """``(bytes the fused kernel keeps besides q, k, v and the output, repeat)`` for a module whose
    key heads equal its query heads (``sdpa``)."""
    k = sdpa(c, masked=masked, heads=heads, kv_heads=heads, d_qk=d_qk, d_v=d_v, s=s, skv=skv)
    return k.kernel, k.repeat


def llama_layer(arch: ArchSpec, L: LayerLayout, c: Ctx, *, grad_in: bool, moe: bool, masked: bool,
                qk_norm: bool) -> int:
    """One decoder layer of a Llama-style family (llama.py's ``_VARIANTS``)."""
    D, t, b, s, skv, h, a, hq, hkv = c.D, c.t, c.b, c.s, c.skv, c.h, c.a, c.hq, c.hkv
    trains, full = c.trains, c.full
    style = L.norm
    post = L.norms == "post"
    n = 0
    if L.fused_qkv:
        attn_in: tuple[str, ...] = ("qkv_proj",)
    elif L.mla:
        attn_in = ("q_a_proj" if L.mla[0] else "q_proj", "kv_a_proj_with_mqa")
    else:
        attn_in = ("q_proj", "k_proj", "v_proj")
    mlp_in = ("gate_up_proj",) if L.fused_gate_up else ("gate_proj", "up_proj")
    # --- attention input: a pre-norm's output, or (OLMo2) the residual stream itself
    if post:
        n += lin_in(c, t * h, *attn_in)
    else:
        n += norm_bytes(style, c, grad_in=grad_in, weight_trains=full, out_kept=False, readers=attn_in)
    if L.mla:
        n += _mla_bytes(arch, L, c)
    else:
        n += _attention(arch, L, c, masked=masked, qk_norm=qk_norm, grad_in=grad_in)
    # --- after attention, then the MLP's input (a MoE layer's router and gathered input keep it,
    # when they train)
    router = "router" if L.moe_kind == "llama4" else "gate"
    readers = ((router, *(("gate_proj", "up_proj") if L.shared_expert_size else ())) if moe else mlp_in)
    if L.norms == "sandwich":  # Gemma 2/3: post_attention_layernorm (to the residual), pre_feedforward_layernorm
        n += norm_bytes(style, c, grad_in=True, weight_trains=full, out_kept=False)
        n += norm_bytes(style, c, grad_in=True, weight_trains=full, out_kept=False, readers=readers)
    elif post:  # OLMo2: post_attention_layernorm, then the residual sum feeds the MLP
        n += norm_bytes("rms_olmo2", c, grad_in=True, weight_trains=full, out_kept=False)
        n += lin_in(c, t * h, *readers)
    else:
        n += norm_bytes(style, c, grad_in=True, weight_trains=full, out_kept=False, readers=readers)
    if moe:
        n += _moe_bytes(arch, L, c)
    else:
        i = L.dense_intermediate_size if (L.dense_layers and L.dense_intermediate_size) else arch.intermediate_size
        n += 3 * c.C * t * i + (c.C * t * i if trains("down_proj") else 0)  # gate, act, up; their product
    if L.norms == "sandwich":
        n += norm_bytes(style, c, grad_in=True, weight_trains=full, out_kept=False)  # post_feedforward_layernorm
    elif post:
        n += norm_bytes("rms_olmo2", c, grad_in=True, weight_trains=full, out_kept=False)  # post_feedforward
    return n


def _attention(arch: ArchSpec, L: LayerLayout, c: Ctx, *, masked: bool, qk_norm: bool, grad_in: bool,
               qkv: str = "qkv_proj", out: str = "o_proj", single_kv_view: bool = False) -> int:
    """q, k, v, the kernel and the output projection's input of a grouped-query attention (``qkv``: the
    fused projection's name, ``out``: the output projection's: Falcon's ``query_key_value``, ``dense``;
    ``single_kv_view``: see ``_sdpa_attention``)."""
    D, t, b, s, skv, a, hq, hkv = c.D, c.t, c.b, c.s, c.skv, c.a, c.hq, c.hkv
    kv = c.kv
    full = c.full
    n = 0
    # in the first layer over frozen embeddings, q (k) needs a gradient only through a trained q_proj (k_proj)
    wq = hq if grad_in or c.adapted("q_proj", qkv) else 0
    wk = hkv if grad_in or c.adapted("k_proj", qkv) else 0
    if qk_norm and L.qk_norm == "head":
        n += 4 * t * (wq + wk) + 4 * t * (a * bool(wq) + kv * bool(wk))
        if full:  # the weight's operand: q, k (matmul outputs) normalized, cast back to their dtype
            n += (c.C if L.norm == "rms" else 4) * t * (hq + hkv)
        if L.norm == "rms_gemma":
            n += 2 * 4 * arch.head_dim
    elif qk_norm and L.qk_norm == "full":
        n += 4 * t * (wq + wk) + 4 * t * (bool(wq) + bool(wk)) + (4 * t * (hq + hkv) if full else 0)
    elif qk_norm and L.qk_norm == "l2":
        n += 4 * t * (wq + wk) + 4 * t * (a * bool(wq) + kv * bool(wk))
    if c.eager:
        from memfit.core.activations.common import _attention_bytes

        C = c.C  # the scores' matmul runs in the compute dtype (autocast casts the rotated q and k)
        # the softmax in fp32 (by the model's dtype argument, or CUDA autocast's fp32_set_opt_dtype)
        soft = 4 if L.eager_softmax_fp32 or c.amp else C
        n += _attention_bytes(D=C, b=b, s=s, skv=skv, t=t, hq=hq, hkv=hkv, a=a, eager=True, gqa=c.gqa,
                              repeat_kv=True, upcast_qk=False, softmax_bytes=soft)
        if L.attn_softcap:
            n += C * b * a * s * skv  # tanh output of the soft-capped scores
        kd = C if L.rotary_keeps_dtype else D  # the rotated k: promoted to cos/sin's dtype, or cast back
        # under AMP prefix tuning's fp32 virtual keys and values promote the cache's cat to fp32
        kd = D if c.amp and skv != s else kd
        vd = D if c.amp and skv != s else C
        if c.cache and c.gqa:  # the cache (outputs) besides the repeats
            n += (kd + vd) * b * skv * hkv
        elif c.cache:  # the matmuls use autocast's copies, not the cache's fp32 k (v)
            n += (kd if kd != C else 0) * b * skv * hkv + (vd if vd != C else 0) * b * skv * hkv
        kview = False
        if single_kv_view and kv == 1 and b == 1:  # repeat_kv's expanded view of the one head reaches bmm as
            # it is when b == 1 (batch and heads fold without a copy): k (v) is the cache's, unless autocast
            # casts it (the cast of the view is a copy of every head)
            kview = kd == C
            for view, dt in ((kview, kd), (vd == C, vd)):
                n -= C * b * skv * hq - (0 if c.cache else dt * b * skv * hkv) if view else 0
        if not grad_in:  # the first layer over frozen embeddings: q, k need a gradient through their
            # projections (a fused one for both), k also through prefix tuning's virtual keys; the scores'
            # matmul keeps q only for k's gradient and k for q's
            q_need = c.adapted("q_proj", qkv)
            k_need = c.adapted("k_proj", qkv) or skv != s
            n -= 0 if k_need else C * t * hq
            n -= C * b * skv * hq if not q_need and (c.gqa or kd != C) and not kview else 0
            # the probabilities' cast to the compute dtype (the softmax keeps its own fp32 output) is kept by
            # probs @ v for v's gradient only: v needs none through a frozen v_proj (prefix tuning's virtual
            # values need one)
            v_need = c.adapted("v_proj", qkv) or skv != s
            n -= C * b * a * s * skv if not v_need and (q_need or k_need) and soft != C else 0
        if not c.trains(out):
            n -= C * t * hq  # the merged heads are o_proj's input only
        return n
    return n + _sdpa_attention(arch, L, c, masked=masked, grad_in=grad_in, qkv=qkv, out=out,
                               single_kv_view=single_kv_view)


def _sdpa_attention(arch: ArchSpec, L: LayerLayout, c: Ctx, *, masked: bool, grad_in: bool = True,
                    qkv: str = "qkv_proj", out: str = "o_proj", single_kv_view: bool = False) -> int:
    """sdpa on the rotated q, k (in the stream's dtype ``D`` under AMP: cos/sin are made in it) and v:
    what the kernel keeps (``sdpa``), the cache's k and v (model outputs), the output o_proj reads.
    ``single_kv_view``: ``repeat_kv`` of one key/value head is a view (its ``expand`` over a size-1 head
    dimension reshapes without a copy: stride 0), so the kernel keeps the cache's k and v, unless autocast
    casts them (the cast of the expanded view is a full copy); counted so for Falcon (transformers 5.25)."""
    D, C, t, b, skv, hq, hkv = c.D, c.C, c.t, c.b, c.skv, c.hq, c.hkv
    k = sdpa(c, masked=masked, heads=c.a, kv_heads=c.kv, d_qk=arch.head_dim, d_v=arch.head_dim, s=c.s, skv=skv)
    given = hq if k.repeat else hkv
    n = k.kernel
    # the kernel's k is the cache's unless repeated, or cast by autocast (the cache keeps the rotated
    # k in the stream's dtype); its v is the cache's unless repeated
    kd = C if L.rotary_keeps_dtype else D  # the rotated k: promoted to cos/sin's dtype, or cast back
    # under AMP prefix tuning's fp32 virtual keys and values promote the cache's cat to fp32
    kd = D if c.amp and skv != c.s else kd
    vd = D if c.amp and skv != c.s else C
    if k.kind == "flash" and c.kernels == "cuda":  # CUDA's flash runs in 16 bits only: the q, k, v it
        # keeps and its output are 16-bit
        C = 2 if C == 4 else C  # (fp32 ones cast by transformers' flash integration: ``sdpa``)
    copies = k.repeat and not (single_kv_view and c.kv == 1)  # the repeat allocates k, v for every head
    k_shared, v_shared = not (copies or kd != C), not (copies or vd != C)
    if k.keeps_qkv:
        n += C * t * hq + C * t * hq  # q (autocast's copy under AMP), the output (o_proj's input)
        n += 0 if k_shared else C * b * skv * given
        n += 0 if v_shared else C * b * skv * given
    else:  # math: the output reaches o_proj as a copy (transpose().contiguous()), kept when o_proj trains
        n += C * t * hq if c.trains(out) else 0
        n += C * b * skv * given if k.keeps_v and not v_shared else 0
        if not grad_in:  # the first layer over frozen embeddings: the scores' matmul keeps the scaled q
            # only for k's gradient and the scaled k only for q's (as the eager path above)
            n -= 0 if c.adapted("k_proj", qkv) or skv != c.s else 4 * t * hq
            n -= 0 if c.adapted("q_proj", qkv) else 4 * b * skv * c.a * arch.head_dim
    n += kd * b * skv * hkv if c.cache or (k.keeps_qkv and k_shared) else 0
    n += vd * b * skv * hkv if c.cache or ((k.keeps_qkv or k.keeps_v) and v_shared) else 0
    if L.fused_qkv and k.kind == "flash" and c.trains(out):
        # q built by a cat (heads-major): flash's output follows q's layout, and o_proj gets a copy of
        # it transposed back, which it keeps when it trains (the memory-efficient kernel allocates its
        # output tokens-major)
        n += C * t * hq
    return n


def _mla_bytes(arch: ArchSpec, L: LayerLayout, c: Ctx) -> int:
    """DeepSeek-V3 multi-head latent attention (modeling_deepseek_v3.DeepseekV3Attention)."""
    D, t, b, s, a = c.D, c.t, c.b, c.s, c.a
    q_rank, kv_rank, nope, rope, v = L.mla
    qk = nope + rope
    n = 0
    if q_rank:
        n += 4 * t * q_rank + 4 * t + (D * t * q_rank if c.full else 0)  # q_a_layernorm
        n += D * t * q_rank if c.trains("q_b_proj") else 0  # its output, q_b_proj's input
    n += D * t * a * qk  # query = cat(q_pass, rotated q_rot)
    n += 4 * t * kv_rank + 4 * t + (D * t * kv_rank if c.full else 0)  # kv_a_layernorm
    n += D * t * kv_rank + D * t * rope  # the cached latent (kv_b_proj's input) and rotated k_rot
    # kv_b_proj's output: k_nope (copied into key_states) and the values, a view of it that sdpa keeps;
    # eager's matmul folds the batch into one dimension: a view when b == 1 (which keeps all of it),
    # else a copy of the values
    n += D * t * a * (nope + v) if not c.eager or b == 1 else D * t * a * v
    n += D * t * a * qk  # key_states, assembled in a new tensor
    kernel, _ = sdpa_kernel_bytes(c, masked=False, heads=a, d_qk=qk, d_v=v, s=s, skv=s)
    if c.eager:  # the fp32 probabilities and their copy; the output is o_proj's input copy (kept when it trains)
        kernel = 4 * b * a * s * s + D * b * a * s * s
    n += kernel + (D * t * a * v if not c.eager or c.trains("o_proj") else 0)
    return n


def _moe_bytes(arch: ArchSpec, L: LayerLayout, c: Ctx) -> int:
    """A mixture-of-experts feed-forward (see the module docstring); Llama 4 runs every expert."""
    D, t, h = c.D, c.t, c.h
    E, k, i = arch.num_experts, arch.experts_per_token, arch.intermediate_size
    n = 0
    if L.moe_kind == "llama4":
        C = c.C
        n += 4 * t * E + 8 * t * k  # sigmoid scores (fp32), top-k indices
        # the repeated input (the stream's dtype), the scores column; the scaled input the experts' bmm
        # keeps (under AMP autocast's copy of the fp32 product)
        n += D * t * E * h + C * t * E + C * t * E * h
        n += 4 * C * t * E * i  # gate_up output, activation, product
        if not c.trains("experts", "gate_up_proj", "down_proj"):
            n -= C * t * E * (h + i)  # frozen experts: bmm keeps neither the scaled inputs nor the product
    else:
        fp32_router = bool(L.mla) or L.router_renorm  # the weights stay fp32 when renormalised
        n += 4 * t * E + 8 * t * k
        if L.mla:  # DeepSeek: sigmoid router in fp32 on an fp32 copy of the input and weight
            n += 4 * E * h + 4 * t + 4 * t * k + (4 * t * h if c.trains("gate") else 0)
        elif L.router_renorm:
            n += 4 * t * k + 4 * t  # renormalised top-k weights and their sum
        weight = 4 if fp32_router else D
        tk = t * k
        n += D * tk * (2 * h + 4 * i) + tk * (weight + 24) + 4 * E
        if not c.trains("experts", "gate_up_proj", "down_proj"):
            n -= D * tk * (h + i)  # frozen experts: _grouped_mm keeps neither the gathered input nor the product
    if L.shared_expert_size:
        si = L.shared_expert_size
        n += 3 * c.C * t * si + (c.C * t * si if c.trains("down_proj") else 0)  # gate, act, up; the product
        if L.shared_expert_gate:
            n += c.C * t * h + c.C * t  # shared expert's output and its sigmoid gate
    return n
