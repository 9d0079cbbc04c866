"""Activation bytes per layer of LayerNorm decoders (GPT-NeoX, Falcon), BERT-style encoders
(BERT, RoBERTa, DeBERTa-v2) and T5-style encoder-decoders (T5, mT5, umT5).

Counted tensor by tensor from each modeling file (transformers 5), as ``families`` does
for the Llama-style decoders; see there for the shared conventions. ``nn.LayerNorm`` keeps its input
(D h) and an fp32 mean and rstd per token (8 bytes: CUDA's ``native_layer_norm`` returns them in
fp32; the CPU fake kernel the trace runs returns them in the input dtype, 4 bytes less per token).
Dropout in training keeps a 1-byte mask per element (CUDA's fused ``native_dropout``).
"""

from __future__ import annotations

from memfit.core.activations.families import Ctx, lin_in, sdpa, sdpa_kernel_bytes
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


def gelu_new_amp(C: int, n: int) -> int:
    """``gelu_new`` (activations.NewGELUActivation: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``)
    under CUDA autocast, with its input: ``pow`` is on the fp32 list (an fp32 copy of x, which it keeps;
    not x itself), the sum promotes, so tanh, 1 + tanh and the product are fp32; 0.5 x stays 16-bit."""
    return 4 * n + 4 * n + 4 * n + 4 * n + C * n


def neox_layer(arch: ArchSpec, L: LayerLayout, c: Ctx, *, grad_in: bool) -> int:
    """GPT-NeoX and Falcon (modeling_gpt_neox.py, modeling_falcon.py): LayerNorm, fused qkv, rotary q
    and k (promoted to cos/sin's dtype, the stream's: fp32 under AMP), the MLP (``dense_h_to_4h``, its
    activation, ``dense_4h_to_h``)."""
    D, C, t, b, s, skv, h, a, hq, hkv, i = c.D, c.C, c.t, c.b, c.s, c.skv, c.h, c.a, c.hq, c.hkv, c.i
    falcon = arch.model_type == "falcon"
    n = D * t * h + _LN * t if grad_in else 0  # the layer input and the first LayerNorm's statistics
    # its output: query_key_value's input, and the MLP's in Falcon's parallel blocks with one norm
    single = falcon and L.parallel and not L.two_norms_parallel
    n += lin_in(c, t * h, "query_key_value", *(("dense_h_to_4h",) if single else ()))
    # second LayerNorm: NeoX's post_attention_layernorm (on the same input when parallel), Falcon's
    # ln_mlp (new architecture) or its post-attention norm (sequential blocks, on the residual sum)
    if (not falcon and L.parallel) or L.two_norms_parallel:
        n += (_LN * t if grad_in else 0) + lin_in(c, t * h, "dense_h_to_4h")
    elif not L.parallel:
        n += D * t * h + _LN * t + lin_in(c, t * h, "dense_h_to_4h")
    if falcon and L.shared_attention:  # transformers 5.25's FalconAttention: Llama's attention functions
        n += _shared_attention(arch, L, c, grad_in=grad_in)
    else:
        n += _neox_attention(arch, L, c, falcon=falcon)
    # a parallel block's MLP in the first layer over frozen embeddings sees nothing that needs a
    # gradient unless dense_h_to_4h trains: it keeps nothing
    mlp = grad_in or not L.parallel or c.adapted("dense_h_to_4h")
    if mlp:  # dense_h_to_4h's output (the activation's input), the activation's own tensors and its output
        n += C * t * i + _mlp_act(L.act, C, t * i) - C * t * i + (C * t * i if c.trains("dense_4h_to_h") else 0)
    # dropout before the residual add: NeoX's post_attention_dropout and post_mlp_dropout, Falcon's one
    n += _drop(L.hidden_dropout, t * h) * (1 if falcon else 1 + mlp)
    return n


def _shared_attention(arch: ArchSpec, L: LayerLayout, c: Ctx, *, grad_in: bool) -> int:
    """Falcon from transformers 5.25 (``modeling_falcon.py:FalconAttention.forward``): q, k, v are
    views of ``query_key_value``'s output with their own head counts (``num_kv_heads`` groups with
    the new decoder architecture, one key head with ``multi_query``), rotated, then
    ``ALL_ATTENTION_FUNCTIONS`` (sdpa with the explicit causal mask Falcon always builds:
    ``allow_is_causal_skip=False``, so k, v are repeated to every head; or ``eager_attention_forward``:
    ``repeat_kv`` and the fp32 softmax) and ``dense``: the Llama-style count (``families._attention``)."""
    from memfit.core.activations.families import _attention

    return _attention(arch, L, c, masked=True, qk_norm=False, grad_in=grad_in, qkv="query_key_value", out="dense",
                      single_kv_view=True)


def _neox_attention(arch: ArchSpec, L: LayerLayout, c: Ctx, *, falcon: bool) -> int:
    """q, k, v, the cache (model outputs), the kernel's tensors and the dense layer's input."""
    D, C, t, b, s, skv, a, hq, hkv = c.D, c.C, c.t, c.b, c.s, c.skv, c.a, c.hq, c.hkv
    prefix = skv != s
    kd = D  # the rotated k (and q): promoted to cos/sin's dtype
    vd = D if c.amp and prefix else C  # prefix tuning's fp32 values promote the cache's cat under AMP
    kd = D if c.amp and prefix else kd
    dense = c.trains("dense")
    mqa = falcon and hkv < hq and not L.two_norms_parallel and arch.num_kv_heads == 1
    soft = D if falcon else 4  # Falcon's softmax runs in the hidden states' dtype, NeoX's in fp32
    if c.eager and mqa:  # Falcon-7B: the single key head broadcast by matmul (as in the math kernel below)
        n = kd * b * skv * hkv + vd * b * skv * hkv  # the cache's k and v (outputs)
        n += soft * b * a * s * skv + (C * b * a * s * skv if soft != C else 0)  # probabilities (+ their copy)
        if b == 1:  # q (or autocast's copy), k and v as the cache holds them (or autocast's copies)
            n += C * t * hq + (C * b * skv * hkv if kd != C else 0) + (C * b * skv * hkv if vd != C else 0)
        else:  # q, k and v expanded to every head
            n += C * t * hq + 2 * C * b * skv * hq
        return n + (C * t * hq if dense else 0)  # the merged heads, dense's input
    if c.eager:
        from memfit.core.activations.common import _attention_bytes

        n = _attention_bytes(D=C, b=b, s=s, skv=skv, t=t, hq=hq, hkv=hkv, a=a, eager=True, gqa=hkv != hq,
                             repeat_kv=True, upcast_qk=False, softmax_bytes=soft)
        kv = hq if falcon else hkv  # the cache's k and v when the scores use autocast's copies of them
        n += (kd * b * skv * kv if kd != C else 0) + (vd * b * skv * kv if vd != C else 0)
        return n - (0 if dense else C * t * hq)  # the merged heads are dense's input only
    if mqa:
        # Falcon-7B's multi-query attention: one key head broadcast to all query heads, which no fused
        # CUDA kernel takes: sdpa's math kernel (fp32 q, k, v; ``cuda_kernels._math``). matmul broadcasts
        # the single key head: a view of it when b == 1, copies expanded to every head when b > 1
        # the cache's k (rotated) and v (outputs; a token classifier's have no cache): fp32's v is the
        # kernel's own when b == 1
        n = D * b * s * hkv + C * b * s * hkv if c.cache else (4 * t * hkv if C == 4 and b == 1 else 0)
        n += 4 * b * a * s * s  # the probabilities
        if b == 1:
            n += 4 * t * hq + 4 * t * hkv + (4 * t * hkv if C == 2 else 0)  # scaled q, scaled k, v's fp32 copy
        else:
            n += 3 * 4 * t * hq  # q, k and v expanded to every head
        return n + (C * t * hq if dense else 0)  # the output's copy, dense's input
    masked = falcon or prefix  # Falcon passes its causal mask to sdpa explicitly
    kv = hq if falcon else hkv  # the new architecture broadcasts k, v to every head first
    k = sdpa(c, masked=masked, heads=a, kv_heads=kv // arch.head_dim, d_qk=arch.head_dim, d_v=arch.head_dim,
             s=s, skv=skv, gqa_module=False)
    # the cache's k and v (the kernel's, unless cast); without a cache (a token classifier's outputs have
    # none) a k or v the kernel does not keep itself (autocast cast it) is freed after the cast
    keep_k = c.cache or not k.keeps_qkv or kd == C
    keep_v = c.cache or not k.keeps_qkv or vd == C
    n = k.kernel + (kd * b * skv * kv if keep_k else 0) + (vd * b * skv * kv if keep_v else 0)
    if k.keeps_qkv:
        n += C * t * hq + C * t * hq  # q (autocast's copy under AMP), the output
        n += C * b * skv * kv if kd != C else 0  # autocast's copies of k and v
        n += C * b * skv * kv if vd != C else 0
        # q is built by a cat (heads-major): flash's output follows its layout and reaches dense as a
        # copy (the memory-efficient kernel allocates its output tokens-major)
        n += C * t * hq if k.kind == "flash" and dense else 0
    else:
        n += C * t * hq if dense else 0
    return n


def bert_layer(arch: ArchSpec, L: LayerLayout, c: Ctx, *, grad_in: bool) -> int:
    """BERT, RoBERTa, DeBERTa-v2 (post-LayerNorm encoder layers with dropout). The layer input (the
    previous LayerNorm's output) is kept by q, k, v when they train; each block's residual sum by its
    LayerNorm; the attention block's LayerNorm output by the intermediate dense (``dense`` is the name of
    all three of a layer's dense Linears)."""
    D, C, t, b, s, skv, h, a, i = c.D, c.C, c.t, c.b, c.s, c.skv, c.h, c.a, c.i
    p, pa = L.hidden_dropout, L.attention_dropout
    if L.relative_attention == "deberta":
        n = lin_in(c, t * h, "query_proj", "key_proj", "value_proj")
        n += _deberta_attention(arch, L, c, grad_in=grad_in)
    else:
        n = lin_in(c, t * h, "query", "key", "value")
        n += C * t * h + 2 * C * b * skv * h  # q, k, v (prefix tuning: k, v over the virtual tokens, a cat)
        if c.eager:  # the probabilities (fp32 under CUDA autocast), dropout's mask and output (autocast's
            # copy of it), the merged heads (the attention output dense's input)
            soft = 4 if c.amp else C
            n += soft * b * a * s * skv
            n += _drop(pa, b * a * s * skv) + (C * b * a * s * skv if pa > 0 or soft != C else 0)
            n += C * t * h if c.trains("dense") else 0
            if not grad_in:  # the first layer over frozen embeddings: the scores' matmul keeps q only for
                # k's gradient (a trained key, prefix tuning's virtual keys), k only for q's
                n -= 0 if c.adapted("key") or skv != s else C * t * h
                n -= 0 if c.adapted("query") else C * b * skv * h
        else:
            k = sdpa(c, masked=False, heads=a, kv_heads=a, d_qk=arch.head_dim, d_v=arch.head_dim, s=s, skv=skv)
            n += k.kernel + C * t * h  # the kernel's state; its output (the attention output dense's input)
    # attention output: dense, dropout, residual add (the LayerNorm's input), statistics, its output
    n += _drop(p, t * h) + D * t * h + _LN * t + lin_in(c, t * h, "dense")
    # the intermediate dense's output (the activation's input), the activation's tensors and output
    n += C * t * i + _mlp_act(L.act, C, t * i) - C * t * i + (C * t * i if c.trains("dense") else 0)
    n += _drop(p, t * h) + D * t * h + _LN * t  # output dropout, residual sum, LayerNorm statistics
    return n


def _deberta_attention(arch: ArchSpec, L: LayerLayout, c: Ctx, *, grad_in: bool) -> int:
    """DeBERTa-v2's disentangled attention (eager only): content-to-position and position-to-content
    scores over ``2 x att_span`` relative positions, gathered per query/key."""
    D, C, t, b, s, h, a = c.D, c.C, c.t, c.b, c.s, c.h, c.a
    span2 = 2 * L.position_buckets
    n = 4 * C * t * h  # q, k, v in head layout (contiguous copies), the scaled query
    n += C * t * h if c.trains("dense") else 0  # the merged heads, the output dense's input
    n += 2 * C * b * a * s * span2  # c2p and p2c scores before the gather
    n += 2 * 8 * s * s  # the two gather index tensors (int64, shared by the batch)
    soft = 4 if c.amp else C  # the softmax in fp32 under CUDA autocast
    n += soft * b * a * s * s + b * s * s  # probabilities, the bool mask
    pa = L.attention_dropout
    n += _drop(pa, b * a * s * s) + (C * b * a * s * s if pa > 0 or soft != C else 0)  # (autocast's copy)
    n += 2 * C * b * a * span2 * (h // a)  # pos_key/pos_query layers repeated for batch x heads
    # the shared relative embeddings through pos_dropout in every layer: its mask when they train, its
    # output kept by the projections of them that train (their lora_A's output r wide)
    if L.hidden_dropout > 0 and c.full:
        n += span2 * h
    n += lin_in(c, span2 * h, "query_proj", "key_proj")
    n += sum(C * span2 * c.r for name in ("query_proj", "key_proj") if c.r and c.adapted(name) and not c.full)
    if not grad_in:  # the first layer over frozen embeddings: content and position terms of q (k) are kept
        # only for the gradient of k (q), which needs one only through a trained key_proj (query_proj)
        for own, other in (("query_proj", "key_proj"), ("key_proj", "query_proj")):
            if not c.adapted(other):
                n -= C * t * h + C * b * a * span2 * (h // a)
    return n


def t5_encoder_layer(arch: ArchSpec, L: LayerLayout, c: Ctx, *, own_bias: bool, grad_in: bool = True) -> int:
    """A T5 encoder block: self-attention with the relative position bias, then the feed-forward."""
    C, t, s, h, hq = c.C, c.t, c.s, c.h, c.hq
    n = _t5_norm(c, "q", "k", "v", grad_in=grad_in)
    n += _t5_kept(c, grad_in, "q") + _t5_kept(c, grad_in, "k") + C * t * hq  # q, k, v
    n += _t5_attention(L, c, s, s, bias=True)  # the kernel or the scores
    n += 8 * s * s if own_bias and c.full else 0  # this block's bucket indices (the bias embedding's input,
    # kept when the bias trains)
    n += _drop(L.hidden_dropout, t * h) + (_t5_clamp(c) if grad_in or c.adapted("q", "k", "v", "o") else 0)
    n += _t5_norm(c, *_ff_in(L)) + _t5_ff(arch, L, c) + _drop(L.hidden_dropout, t * h)
    return n + (_t5_clamp(c) if grad_in or c.adapted("q", "k", "v", "o", *_ff_in(L), "wo") else 0)


def t5_decoder_layer(arch: ArchSpec, L: LayerLayout, c: Ctx, *, s_enc: int, own_bias: bool, cross_bias: bool,
                     grad_in: bool = True) -> int:
    """A T5 decoder block: causal self-attention (bias + causal mask), cross-attention (its k and v
    projections read the encoder's output: under AMP each makes its own 16-bit copy), FF."""
    C, t, b, s, h, hq = c.C, c.t, c.b, c.s, c.h, c.hq
    self_grad = grad_in or c.adapted("q", "k", "v", "o")  # else (prompt tuning's first block over frozen
    # embeddings) its self-attention keeps nothing: only the cache's k and v, which the outputs hold
    n = 2 * C * t * hq
    if self_grad:
        n += _t5_norm(c, "q", "k", "v", grad_in=grad_in)
        n += _t5_kept(c, grad_in, "q") + _t5_attention(L, c, s, s, bias=True)  # self: q; the kernel or the scores
        # sdpa: the causal mask sdpa_attention merges into the bias, kept by the where when the bias trains
        n += s * s if not c.eager and c.full else 0
        n += 8 * s * s if own_bias and c.full else 0
        n += _drop(L.hidden_dropout, t * h) + _t5_clamp(c)
    n += _t5_norm(c, "q", grad_in=self_grad)
    n += C * t * hq + 2 * C * b * s_enc * hq + _t5_attention(L, c, s, s_enc, bias=cross_bias)  # cross-attention
    n += sum(C * b * s_enc * h for name in ("k", "v") if c.amp and c.trains(name))  # the encoder output's copies
    n += _drop(L.hidden_dropout, t * h) + _t5_clamp(c)
    n += _t5_norm(c, *_ff_in(L)) + _t5_ff(arch, L, c) + _drop(L.hidden_dropout, t * h)
    return n + _t5_clamp(c)


def _t5_clamp(c: Ctx) -> int:
    """T5Block's clamp of float16 hidden states after each sub-layer (transformers 5.24
    models/t5/modeling_t5.py T5Block.forward; mT5's and umT5's blocks are the same code):
    ``torch.clamp(hidden_states, min=-clamp_value, max=clamp_value)`` with 0-d bounds from
    ``torch.where(isinf(...).any(), max - 1000, max)`` (Python floats: the default fp32). clamp.Tensor's
    node (tools/autograd/derivatives.yaml) keeps its input, the residual sum (D t h; the next norm keeps
    the clamped copy), and both bounds (4 B each), when the input needs a gradient. bfloat16 and fp32
    streams are not clamped; neither is an fp32 stream under autocast (the residual sums stay fp32)."""
    return c.D * c.t * c.h + 4 + 4 if c.float16 else 0


def _t5_kept(c: Ctx, grad_in: bool, name: str) -> int:
    """q (``name`` "q") or k ("k") of a T5 self-attention as its scores keep them: in the first block over
    frozen embeddings (``grad_in`` false) eager's matmul keeps q only for k's gradient (an adapted k) and
    k only for q's (the fused kernels keep both)."""
    other = "k" if name == "q" else "q"
    return c.C * c.t * c.hq if grad_in or not c.eager or c.adapted(other) else 0


def _ff_in(L: LayerLayout) -> tuple[str, ...]:
    return ("wi_0", "wi_1") if L.gated else ("wi",)


def _t5_norm(c: Ctx, *readers: str, grad_in: bool = True) -> int:
    """T5LayerNorm (modeling_t5.T5LayerNorm): ``hidden * rsqrt(variance)`` keeps the input (16-bit
    next to the fp32 copy ``pow`` keeps; in fp32 and under AMP one tensor) and the rsqrt when the
    input needs a gradient; the weight's operand when it trains (the normalized tensor cast back to a
    16-bit weight's dtype); its output, kept by the Linears ``readers`` that train (``lin_in``)."""
    D, t, h = c.D, c.t, c.h
    n = (D * t * h + (4 * t * h if D != 4 else 0) + 4 * t) if grad_in else 0
    n += D * t * h if c.full else 0
    return n + lin_in(c, t * h, *readers)


def _t5_attention(L: LayerLayout, c: Ctx, s: int, skv: int, *, bias: bool) -> int:
    """sdpa gets the bias as a float mask: the memory-efficient kernel keeps it (per layer; under AMP
    autocast's 16-bit copy of the fp32 bias), the output and a padded logsumexp. eager (T5Attention):
    softmax in the dtype, dropout (mask and output), the merged heads; the bias is added, not kept."""
    C, b, a, hq = c.C, c.b, c.a, c.hq
    if c.eager:
        # transformers 5.24 t5 eager_attention_forward: softmax (CUDA autocast: fp32 output, its
        # fp32_set_opt_dtype list) keeps its output; dropout its mask; the matmul with v its input (the
        # dropout's output, or autocast's 16-bit copy of the fp32 probabilities); the merged heads'
        # contiguous copy is o's input only
        p, x = L.attention_dropout, b * a * s * skv
        soft = 4 if c.amp else C
        n = soft * x + ((x + C * x) if p > 0 else (C * x if c.amp else 0))
        return n + (C * b * s * hq if c.trains("o") else 0)
    n = C * b * s * hq + 4 * b * a * ((s + 31) // 32 * 32) + 16
    return n + (C * a * s * skv if bias else 0)


def t5_held_biases(arch: ArchSpec, c: Ctx, s_dec: int) -> int:
    """Under checkpointing, the biases T5 and mT5 compute in block 0 and hand to every later block
    are held for the recomputes: the encoder's, the decoder's (causal) and the cross-attention's. The
    relative biases come from the bias embedding (the model's dtype); the cross-attention has none and
    makes zeros in the query's dtype (T5Attention.forward: ``torch.zeros(..., dtype=query_states.dtype)``,
    autocast's 16-bit dtype under AMP)."""
    if arch.model_type == "umt5":  # every block computes its own
        return 0
    D, C, a, s = c.D, c.C, c.a, c.s
    return D * a * s * s + (D * a * s_dec * s_dec + C * a * s_dec * s if arch.num_encoder_layers else 0)


def _t5_ff(arch: ArchSpec, L: LayerLayout, c: Ctx) -> int:
    """T5's DenseReluDense (``wi``/``wo``) or gated (``wi_0``, ``wi_1``, ``wo``), with its dropout: the
    dropout's output is ``wo``'s input (under AMP autocast's copy of it: T5 first casts it to ``wo``'s
    fp32 weight dtype, a temporary)."""
    C, t, i = c.C, c.t, c.i
    drop = _drop(L.hidden_dropout, t * i)
    wo = C * t * i if c.trains("wo") else 0
    if L.gated:  # wi_0 output, the activation's tensors, wi_1 output, dropout mask and output
        if c.amp and L.act == "gelu_new":
            return gelu_new_amp(C, t * i) + C * t * i + drop + wo
        return C * t * i + _mlp_act(L.act, C, t * i) + C * t * i + drop + wo
    return C * t * i + drop + wo  # relu's output (it keeps its result), dropout mask and output
