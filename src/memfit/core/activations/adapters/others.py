"""The saved tensors of the tuners beside LoRA, each read from its layer's ``forward`` in peft 0.21
(``tuners/<tuner>/layer.py``) and checked against that layer traced on CPU tensors
(``tests/trace/test_adapter_layers_vs_trace.py``). Sizes: ``i``/``o`` the layer's in/out widths, per
token unless said to be fixed; ``A`` the adapter's element size, ``D`` the stream's, ``E`` a matmul's
output element size (autocast's under AMP, else the adapter's).

Under autocast every matmul input that is not 16-bit is cast (a new tensor, kept when the matmul keeps
it); the casts of ``nn.Linear`` weights are the ledger's ``amp.weight_casts``, the others are counted
here (``operand``).
"""

from __future__ import annotations

import math

from memfit.core.activations.adapters import (AdaptedLayer, DtypeContext, Saved, adapter_input, matmul_input,
                                              out_elem)
from memfit.core.peft.spec import PeftSpec


def operand(n: int, elem: int, ctx: DtypeContext) -> int:
    """Bytes a matmul keeps of a non-cached operand of ``n`` elements of ``elem`` bytes (its autocast copy
    under AMP when not 16-bit)."""
    return n * (ctx.autocast if ctx.autocast and elem != ctx.autocast else elem)


def _dropout(layer: AdaptedLayer, p: float) -> Saved:
    return Saved(per_token=layer.in_features, grad_only=layer.in_features) if p and p > 0 else Saved()


def ia3(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``ia3_l (1, in)``: ``(x.to(A) * l).to(D)`` into the base layer: the mul keeps ``x`` in the adapter's
    dtype (a copy when it differs) and the ``(in,)`` scaling; ``(out, 1)``: ``base(x) * l``: the mul keeps the
    base output and the ``(out,)`` scaling (``ia3_scaling = 1 * l.flatten()``, a new vector)."""
    o, i = layer.out_features, layer.in_features
    if layer.shape("ia3_l")[0] == 1:  # feedforward: scales the input
        elem, is_input = adapter_input(ctx)
        return (Saved(keeps_input=True) if is_input else Saved(per_token=i * elem)) + Saved(fixed=i * ctx.adapter)
    return Saved(per_token=o * (ctx.autocast or ctx.stream), fixed=o * ctx.adapter)


def _delta_linear(layer: AdaptedLayer, ctx: DtypeContext, delta_elem: int) -> Saved:
    """``F.linear(x.to(delta.dtype), delta)`` of a rebuilt ``(out, in)`` delta in ``delta_elem`` bytes: keeps
    both (``_cast_input_dtype(input, delta_weight.dtype)``: the input copied when the dtypes differ)."""
    o, i = layer.out_features, layer.in_features
    delta = operand(o * i, delta_elem, ctx)  # kept for the input's gradient
    return matmul_input(delta_elem, ctx.stream == delta_elem, i, ctx) + Saved(fixed=delta, fixed_grad_only=delta)


def loha(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``HadaWeight`` keeps its parameters and a 0-d scale; the delta ``(out, in)`` (16-bit under autocast:
    its products are matmuls) and the input are kept by ``F.linear``; rank dropout keeps its ``(out, 1)``
    row mask in the delta's dtype."""
    elem = out_elem(ctx)
    drop = spec.setting("rank_dropout", 0.0) or 0.0
    return _delta_linear(layer, ctx, elem) + Saved(fixed=4 + (layer.out_features * elem if drop > 0 else 0))


def lokr(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``torch.kron(w1, w2)`` keeps its factors (the low-rank products ``w1_a @ w1_b``/``w2_a @ w2_b`` when
    they are pairs, 16-bit under autocast); the delta is in the adapter's dtype (``kron`` runs outside
    autocast's lists) unless both factors are such products; then the delta and the input as LoHa."""
    fixed = 0
    products = 0
    for w in ("lokr_w1", "lokr_w2"):
        if not layer.has(w):
            (a, r), (_, b) = layer.shape(w + "_a"), layer.shape(w + "_b")
            fixed += a * b * out_elem(ctx)
            if ctx.autocast:  # the factors are leaves: their casts are cached and kept by the product
                fixed += (a * r + r * b) * ctx.autocast
            products += 1
    elem = out_elem(ctx) if products == 2 else ctx.adapter
    drop = spec.setting("rank_dropout", 0.0) or 0.0
    return _delta_linear(layer, ctx, elem) + Saved(fixed=fixed + (layer.out_features * 4 if drop > 0 else 0))


def oft(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``OFTRotationModule.forward``: the rotation (Cayley-Neumann: the skew matrix and the powers the
    series multiplies, ``(r, b, b)`` each; without it ``linalg.solve``'s LU, pivots and result) and the
    input rotated by ``einsum`` (``x`` in the adapter's dtype). The einsum keeps the rotation it reads (``R``,
    its repeat under ``block_share``, or its cast) for ``x``'s gradient only: a first block whose input needs no
    gradient does not keep it (unless it is ``linalg.solve``'s own result, which the solve keeps)."""
    rows, n = layer.shape("oft_R.default.weight")
    b = round((1 + math.sqrt(1 + 8 * n)) / 2)
    r = layer.in_features // b
    A = ctx.adapter
    terms = spec.setting("num_cayley_neumann_terms", 5)
    share = rows != r  # block_share: one block, repeated r times for the einsum (the repeat is kept)
    if spec.setting("use_cayley_neumann", True):
        if ctx.autocast:  # every bmm casts the skew matrix again; R (or its repeat) is cast for the einsum
            fixed = (max(2 * terms - 3, 1) - (1 if share else 0)) * rows * b * b * ctx.autocast + (
                r * b * b * ctx.autocast if share else 0)
            for_x = (r if share else rows) * b * b * ctx.autocast
        else:  # the skew matrix and the powers the next bmm reads, R for the einsum (R's repeat if shared)
            fixed = (max(terms - 2, 0) + (0 if share else 1)) * rows * b * b * A + (r * b * b * A if share else 0)
            for_x = (r if share else rows) * b * b * A
    else:  # linalg.solve on fp32 (the identity is fp32): I + Q, the LU, pivots, R; R cast for the einsum
        fixed = 3 * rows * b * b * 4 + rows * b * 4
        cast = ctx.autocast or (A if A != 4 else 0)
        for_x = (r if share else rows) * b * b * cast if cast else (r * b * b * 4 if share else 0)
        fixed += for_x
    elem, is_input = adapter_input(ctx)
    return matmul_input(elem, is_input, layer.in_features, ctx) + Saved(fixed=fixed, fixed_grad_only=for_x)


def boft(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``BOFTLayer``'s Linear forward: the Cayley transform of every block by ``linalg.solve`` (LU, pivots,
    result), the block-diagonal and ``boft_P`` cast to ``x``'s dtype, their product, ``x @ rotation``
    (keeps ``x`` and, for ``x``'s gradient only, the rotation), and ``result * boft_s`` (keeps the base output and
    the scale)."""
    f, blocks, h, _ = layer.shape("boft_R")
    i, o = layer.in_features, layer.out_features
    A, Dx = ctx.adapter, ctx.stream
    fixed = 3 * f * blocks * h * h * 4 + f * blocks * h * 4  # linalg.solve on fp32 (the identity is fp32)
    if Dx != 4:  # boft_P (an fp32 buffer: DeepSpeed casts params only) .to(x), kept by the bmm
        fixed += f * i * i * Dx
    fixed += 2 * i * i * Dx  # the identity boft_rotation starts from (kept by @) and the rotation (kept by x @)
    fixed += o * Dx + o * max(A, Dx)  # the ones boft_s multiplies, and the scale kept by result * scale
    for_x = i * i * Dx  # the rotation, kept by x @ rotation for x's gradient only (not in a first block)
    if ctx.autocast:
        return matmul_input(Dx, True, i, ctx) + Saved(per_token=o * ctx.autocast, fixed=fixed, fixed_grad_only=for_x)
    return Saved(keeps_input=True, per_token=o * Dx, fixed=fixed, fixed_grad_only=for_x)


def hra(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``HRALinear.get_delta_weight``: ``weight - 2 * weight @ u_i @ u_i.T`` r times (each step keeps the
    running ``(in, in)`` weight and a ``(in, 1)`` product; the normalized ``u`` once; the norms), then
    ``W @ R`` (keeps ``W`` in the adapter's dtype) and ``F.linear(x, W R)``; Gram-Schmidt
    (``apply_GS``): ``I - 2 U U.T`` from the orthonormalized vectors, kept by one product."""
    i, o = layer.in_features, layer.out_features
    r = layer.shape("hra_u")[1]
    A = ctx.adapter
    AC = ctx.autocast
    if spec.setting("apply_GS", False):  # the identity, cat(w) and 2 * cat(w), the vectors of the orthogonalization
        fixed = i * i * A + 2 * i * r * A + (r - 1) * i * A + r * (r - 1) // 2 * (i * A + A) + r * A
    elif AC:  # each step's matmuls cast the running weight and the vectors to 16 bits
        fixed = r * i * i * AC + (3 * r - 1) * i * AC + i * i * AC + r * A
    else:
        fixed = (r + 1) * i * i * A + i * r * A + r * i * A + r * A
    if AC:  # W (cast for W @ R unless 16-bit already) and W R, both kept; x cast to W R's dtype
        fixed += (o * i * AC if (ctx.base or ctx.stream) != AC else 0) + o * i * AC
        return matmul_input(ctx.stream, True, i, ctx) + Saved(fixed=fixed, fixed_grad_only=o * i * AC)
    fixed += (o * i * A if (ctx.base or ctx.stream) != A else 0) + o * i * A
    elem, is_input = adapter_input(ctx)  # W R is kept by F.linear for the input's gradient
    return matmul_input(elem, is_input, i, ctx) + Saved(fixed=fixed, fixed_grad_only=o * i * A)


def vera(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``lambda_b * F.linear(lambda_d * F.linear(dropout(x), A), B)``: the two products with the scaling
    vectors keep ``(tokens, r)`` and ``(tokens, out)``; the projections are buffers (no gradient), so the
    linears keep no input; dropout keeps its mask. Under autocast the slices of the projections are cast
    and kept."""
    o, i = layer.out_features, layer.in_features
    r = layer.shape("vera_lambda_d")[0]
    E = out_elem(ctx)
    fixed = (r * i + o * r) * ctx.autocast if ctx.autocast else 0
    return _dropout(layer, spec.setting("vera_dropout", 0.0)) + Saved(per_token=(r + o) * E, fixed=fixed)


def pvera(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``mu, logvar = (lambda_d * F.linear(dropout(x), A)).chunk(2)``, ``z = mu + randn_like(std) * std`` with
    ``std = exp(0.5 * logvar)`` (training always samples: ``PveraLayer._reparametrize``), then
    ``lambda_b * F.linear(z, B)`` (peft 0.21.2 ``tuners/pvera/layer.py:Linear.forward``): the products with the
    scaling vectors keep ``(tokens, 2r)`` and ``(tokens, out)`` (the linears' outputs); ``exp`` keeps ``std`` and
    the product keeps the noise, ``(tokens, r)`` each in the promoted dtype of ``lambda_d`` and the linear's output;
    the projections are buffers (no gradient), so the linears keep no input; dropout keeps its mask. Under
    autocast the slices of the projections are cast and kept, as VeRA's (``A``'s only for the input's gradient)."""
    o, i = layer.out_features, layer.in_features
    r = layer.shape("pvera_lambda_d")[0] // 2
    E = out_elem(ctx)
    S = max(E, ctx.adapter)  # lambda_d * h: fp32 when either is
    a_cast = 2 * r * i * ctx.autocast  # kept by F.linear(x, A) for the input's gradient only
    fixed = a_cast + o * r * ctx.autocast
    return _dropout(layer, spec.setting("pvera_dropout", 0.0)) + Saved(per_token=(2 * r + o) * E + 2 * r * S,
                                                                       fixed=fixed, fixed_grad_only=a_cast)


def tinylora(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``TinyLoraLayer.Linear.forward`` (peft 0.21.2 ``tuners/tinylora/layer.py``): ``R = einsum("i,ijk->jk", v,
    P.to(v.dtype))`` keeps ``P`` in ``v``'s dtype (a ``(u, r, r)`` copy unless fp32; its 16-bit copy under autocast);
    ``F.linear(dropout(x).to(A.dtype), A)`` keeps only the frozen ``A`` (a buffer; its autocast copy), for the
    input's gradient; ``F.linear(h, R)`` keeps ``h`` ``(tokens, r)`` for ``v``'s gradient and ``R`` for ``h``'s;
    ``F.linear(., B)`` keeps the frozen ``B`` (its autocast copy). ``A`` and ``B`` are fp32 (peft upcasts its
    ``BufferDict`` entries with the adapters, ``cast_adapter_dtype``; DeepSpeed casts parameters only), ``R`` in
    ``v``'s dtype (autocast's under AMP): with 16-bit ``v`` and no autocast peft's ``F.linear(h, R)`` raises."""
    o, i = layer.out_features, layer.in_features
    r = layer.shape("tinylora_A")[0]
    u = layer.shape("tinylora_P")[0]
    AC = ctx.autocast
    rd = AC or ctx.adapter  # R's dtype
    fixed = u * r * r * rd if rd != 4 else 0
    grad_only = r * r * rd + r * i * AC  # R, and A's autocast copy (only F.linear(x, A)'s input needs it)
    fixed += grad_only + o * r * AC
    return _dropout(layer, spec.setting("tinylora_dropout", 0.0)) + Saved(per_token=r * (AC or 4), fixed=fixed,
                                                                          fixed_grad_only=grad_only)


def unilora(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``UniLoraLayer.Linear.forward`` (peft 0.21.2 ``tuners/unilora/layer.py``): ``A = theta_d[indices_A] *
    scales_A`` and ``B`` alike (the index and the product keep only the buffers), fp32 (the scales are fp32
    buffers); then ``F.linear(F.linear(dropout(x.to(theta_d.dtype)), A), B)`` keeps the input (its copy in
    ``theta_d``'s dtype; dropout's output and mask), ``A`` (for the input's gradient), the ``(tokens, r)`` product
    and ``B``; under autocast the 16-bit copies of each. With a 16-bit ``theta_d`` and no autocast peft's
    ``F.linear`` raises (bf16 input, fp32 ``A``)."""
    o, i = layer.out_features, layer.in_features
    r = layer.shape("unilora_indices_A")[0]
    K = ctx.autocast or 4  # A, B, and the product's dtype
    elem, is_input = adapter_input(ctx)
    p = spec.setting("unilora_dropout", 0.0) or 0.0
    path = _dropout(layer, p) + matmul_input(elem, is_input and not p > 0, i, ctx)
    return path + Saved(per_token=r * K, fixed=(r * i + o * r) * K, fixed_grad_only=r * i * K)


def fourierft(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """The delta ``ifft2(dense spectrum).real * scaling`` ``(out, in)`` (in the spectrum's dtype) and the input,
    kept by ``F.linear``."""
    return _delta_linear(layer, ctx, ctx.adapter)


def waveft(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``WaveFTLayer.get_delta_weight``: with ``use_idwt`` the padded coefficients stacked for the inverse
    transform ``(4, H/2, W/2)``, the filters, the cloned indices and the valid mask, then the delta and the
    input as FourierFT; without, the dense spectrum scaled."""
    o, i = layer.out_features, layer.in_features
    n = layer.shape("waveft_spectrum")[0]
    saved = _delta_linear(layer, ctx, ctx.adapter)
    if spec.setting("use_idwt", True):  # the transform's convolutions run in autocast's dtype
        po, pi = o + (o % 2), i + (i % 2)
        saved += Saved(fixed=po * pi * out_elem(ctx) + 16 * ctx.adapter + 2 * n * 8 + n)  # indices (2, n) cloned
    return saved


def miss(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``sum(dropout(x).reshape(..., in // r, r), -2) @ miss``: the ``(tokens, r)`` sum (the input is not
    kept); ``init_weights='bat'``: the whole weight rebuilt (``W.to(A)`` kept by ``W @ block`` and the new
    weight by ``F.linear``, with the input)."""
    shape = layer.shape("miss_block")
    i, o = layer.in_features, layer.out_features
    if spec.setting("init_weights", True) == "bat":
        elem, is_input = adapter_input(ctx)
        return matmul_input(elem, is_input, i, ctx) + Saved(fixed=2 * o * i * ctx.adapter)
    r = shape[0]
    cast = shape[0] * shape[1] * ctx.autocast if ctx.autocast else 0  # the block, a leaf, cast (cached) for @
    return _dropout(layer, spec.setting("miss_dropout", 0.0)) + Saved(per_token=r * out_elem(ctx), fixed=cast)


def vblora(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``_get_low_rank_matrix`` for A and B: top-k indices (int64), their softmax and the gathered bank
    vectors ``(..., k, vl)``; then ``F.linear(F.linear(dropout(x), A), B)`` keeps the input, A, the
    ``(tokens, r)`` product and B."""
    r, ia, nv = layer.shape("vblora_logits_A")
    ob = layer.shape("vblora_logits_B")[0]
    vl = layer.in_features // ia
    k = spec.setting("topk", 2)
    A = ctx.adapter
    fixed = (r * ia * k + ob * r * k) * (8 + A + vl * A)
    fixed += operand(r * layer.in_features, A, ctx) + operand(layer.out_features * r, A, ctx)
    elem, is_input = adapter_input(ctx)
    drop = spec.setting("vblora_dropout", 0.0) or 0.0
    saved = _dropout(layer, drop)
    if drop > 0:
        is_input = False
    return saved + matmul_input(elem, is_input, layer.in_features, ctx) + Saved(per_token=r * out_elem(ctx), fixed=fixed)


def ln_tuning(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """The trained copy runs instead of the module: a Linear keeps its input; an RMSNorm (no bias) keeps its
    normalized output for the weight's gradient; a LayerNorm's kernel keeps only what it keeps anyway."""
    weight = next((s for k, s in layer.tensors.items() if k.endswith(".weight")), ())
    if len(weight) == 2:
        return matmul_input(ctx.stream, True, layer.in_features, ctx)
    if any(k.endswith(".bias") for k in layer.tensors):
        return Saved()
    return Saved(per_token=layer.out_features * (ctx.autocast or ctx.stream))


def osf(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``F.linear(F.linear(x, B), A)`` with ``B = cat(V_low, V_low_init)`` ``(2m, in)`` and
    ``A = cat(U_low * S_low, -U_init * S_init)`` ``(out, 2m)``: keeps the input, B, the ``(tokens, 2m)``
    product and A."""
    m = layer.shape("osf_svd_params.default.S_low")[0]
    i, o = layer.in_features, layer.out_features
    A = 4  # the _osf_*_init buffers are fp32 (peft upcast them, DeepSpeed casts params only): cat promotes
    E = ctx.autocast or A
    return matmul_input(A, ctx.stream == A, i, ctx) + Saved(per_token=2 * m * E,
                                                            fixed=operand(2 * m * i, A, ctx) + operand(o * 2 * m, A, ctx))


def trainable_tokens(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``F.embedding`` of the base weight with the delta rows put in (``index_copy``): the embedding keeps
    the token ids only; the combined ``(vocab, dim)`` weight is rebuilt per forward and kept by nothing."""
    return Saved()


def road(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``_apply_road``: the base output cast to the adapter's dtype (``x``) times ``first_col`` and its
    rotated half (``stack(-x2, x1)``, a new tensor) times ``second_col``: both products keep their
    per-token operand and their column; ``_prepare_cols`` keeps, per variant, what ``cos``/``sin`` and the
    column products need (``road_1``: the repeated theta and alpha and both trig outputs; ``road_2``: the
    trig outputs; ``road_4``: the trig outputs and the two flattened alpha halves), ``out`` elements each."""
    o, a = layer.out_features, ctx.adapter
    fixed = {"road_1": 4, "road_2": 2, "road_4": 4}[spec.setting("variant", "road_1")]
    return Saved(per_token=2 * o * a, fixed=(fixed + 2) * o * a)


def c3a(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``BlockCircularConvolution.apply(x.to(fp32), kernel.to(fp32))`` (``tuners/c3a/utils.py``) saves both:
    ``x`` in fp32 (the input itself when the stream is fp32) and the kernel in fp32 (a copy when the
    adapter is 16-bit); its FFTs run inside the Function (no graph); the division by ``in`` and the
    cast back keep nothing. Autocast does not reach into the Function (no ``custom_fwd``)."""
    m, n, b = layer.shape("c3a_kernel")
    kernel = m * n * b * 4 if ctx.adapter != 4 else 0
    x = Saved(keeps_input=True) if ctx.stream == 4 else Saved(per_token=layer.in_features * 4)
    return x + Saved(fixed=kernel)


def shira(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``F.linear(x, W.clone() + sparse_coo(indices, w * scaling), bias)`` (``tuners/shira/layer.py``
    ``Linear.forward``): the rebuilt ``(out, in)`` weight in the base's dtype, kept for the input's
    gradient (its 16-bit copy under autocast), and the input; the sparse delta is kept whole by the
    in-place add's backward: its int64 indices ``(2, n)`` and its values ``w * scaling`` (adapter dtype)."""
    o, i = layer.out_features, layer.in_features
    n = layer.shape("shira_weight")[0]
    base = ctx.base or ctx.stream
    weight = operand(o * i, base, ctx)
    return (matmul_input(ctx.stream, True, i, ctx)
            + Saved(fixed=weight + n * (16 + ctx.adapter), fixed_grad_only=weight))


def supertuning(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``SupertuningLayer``'s Linear forward (peft 0.21.2 ``tuners/supertuning/layer.py``): ``W.reshape(-1)
    .scatter_add(0, indices.to(int64), values.to(W.dtype))`` (its backward keeps the int64 copy of the indices),
    then ``F.linear(x, W', bias)`` keeps the input and the rebuilt ``(out, in)`` weight in the base's dtype (for
    the input's gradient; its 16-bit copy under autocast), as SHiRA's; with ``r``: ``lora_B(lora_A(dropout(x)
    .to(A.dtype)))`` keeps the input (or its copy in the adapter's dtype; dropout's mask) and the ``(tokens, r)``
    product, as LoRA's (the casts of ``lora_A``/``lora_B``'s weights are the ledger's)."""
    o, i = layer.out_features, layer.in_features
    n = layer.shape("supertuning_values")[0]
    weight = operand(o * i, ctx.base or ctx.stream, ctx)
    saved = matmul_input(ctx.stream, True, i, ctx) + Saved(fixed=weight + 8 * n, fixed_grad_only=weight)
    if layer.has("supertuning_lora_A"):
        r = layer.shape("supertuning_lora_A")[0]
        elem, is_input = adapter_input(ctx)
        p = spec.setting("lora_dropout", 0.0) or 0.0
        saved += (_dropout(layer, p) + matmul_input(elem, is_input and not p > 0, i, ctx)
                  + Saved(per_token=r * out_elem(ctx)))
    return saved


def psoft(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``PsoftLayer``'s Linear forward (peft 0.21.2 ``tuners/psoft/layer.py``): ``x`` cast to the fp32 ``A``
    (dropout on it: a mask), ``xa = x_d @ A.t()`` keeps only the frozen ``A`` (its autocast copy), for the input's
    gradient; ``OrthLayer.forward`` builds ``R`` (``get_matrix``) and ``xa @ R.t()`` keeps ``xa`` ``(tokens, r)`` and
    ``R`` in ``xa``'s dtype; ``(xr - xa) @ B.t()`` keeps the frozen ``B`` (its autocast copy). ``get_matrix`` with
    ``psoft_orth``: the skew matrix from the trained triangle (``index_put`` keeps the index buffers), then
    ``linalg.solve(I - Q, I + Q, left=False)`` in fp32 (its LU, pivots and result), or the Neumann series (the
    skew matrix and the powers its products read); the magnitudes multiply it (each product keeps its
    matrix operand); a 16-bit rotation is cast back after the fp32 solve."""
    o, i = layer.out_features, layer.in_features
    r = layer.shape("_psoft_A_cache")[0]
    AC, Ad = ctx.autocast, ctx.adapter
    K = AC or 4  # xa's dtype (x cast to the fp32 A; autocast's under AMP)
    at = "psoft_R.default."
    orth, mag_b, mag_a = layer.has(at + "rows"), layer.has(at + "vector_b"), layer.has(at + "vector_a")
    solve = orth and not spec.setting("use_cayley_neumann", False)
    rd = 4 if solve else Ad  # R's dtype while the magnitudes multiply it
    if solve:  # linalg.solve on fp32 (as OFT's): three (r, r) tensors (the LU, the result, ...), the pivots (int32)
        fixed = 3 * r * r * 4 + r * 4
    elif orth:  # the skew matrix and the powers the series' products read
        fixed = max(spec.setting("num_cayley_neumann_terms", 5) - 2, 0) * r * r * Ad
    else:
        fixed = 0
    if mag_b and orth and not solve:  # vector_b[:, None] * R keeps the series' R (the solve keeps its result already)
        fixed += r * r * rd
    if mag_a and (orth or mag_b):  # R * vector_a[None, :] keeps R (the trained weight itself costs nothing)
        fixed += r * r * rd
    new = orth or mag_b or mag_a  # R is a new tensor, not the trained weight
    if solve:  # cast back to the trained dtype
        rd = Ad
    # R in xa's dtype (the trained weight: a copy), kept by xa @ R.t() for xa's gradient (none without the input's)
    kept_r = r * r * K if new or rd != K else 0
    grad_only = kept_r + (r * i * AC if AC else 0)
    fixed += grad_only + (o * r * AC if AC else 0)
    return _dropout(layer, spec.setting("psoft_dropout", 0.0)) + Saved(per_token=r * K, fixed=fixed,
                                                                       fixed_grad_only=grad_only)


def poly(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``PolyLayer``'s Linear forward (peft 0.21.2 ``tuners/poly/layer.py``, ``router.py:PolyRouter.forward``): the
    router's per-sample mixing weights (a relaxed Bernoulli sample of the task's logits, normalized), then
    ``A = einsum(w, lora_A).reshape(bs, in, r)`` and ``B`` alike, one ``(in, r)`` and one ``(r, out)`` factor per
    sample; ``x.to(A.dtype).bmm(A).bmm(B)`` keeps the input (its copy in ``A``'s dtype), ``A`` (for the input's
    gradient), the ``(tokens, r)`` product and ``B``. Under autocast the einsums' matmuls keep the casts of the
    stacked factors (leaves: cached)."""
    o, i = layer.out_features, layer.in_features
    q, k, _, r = layer.shape("poly_lora_A")
    AC = ctx.autocast
    E = AC or ctx.adapter  # the mixed factors' dtype
    elem, is_input = E, ctx.stream == E
    fixed = k * (i * r + r * o) * AC if AC else 0
    router = (6 * q * k + q) * ctx.adapter  # the relaxed Bernoulli sample's and the normalization's tensors (the
    # int64 task ids the index keeps are the model's input, shared by every layer)
    return matmul_input(elem, is_input, i, ctx) + Saved(per_token=r * E, fixed=fixed,
                                                        per_sample=(i * r + r * o) * E + router,
                                                        sample_grad_only=i * r * E)


def delora(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``DeloraLinear.forward``: ``x_d * w_norm`` (the buffer needs no gradient: the product is kept by the
    first ``F.linear``, not ``x``), ``h = F.linear(., A)``, ``h * scaling`` (keeps ``h`` and the ``(r,)``
    scaling), ``F.linear(., B)`` (keeps the scaled ``h``); ``scaling = lambda / r / (|A_i| |B^j|)`` keeps
    six ``(r,)`` vectors (the norms, their clamps, their product, the quotient) and ``lambda / r``. The
    fp32 ``w_norm`` makes the product fp32. Under autocast each linear keeps 16-bit copies of
    its operands (the leaves' cached casts too), and ``h * scaling`` is promoted to the scaling's dtype."""
    i = layer.in_features
    r = layer.shape("delora_A")[0]
    A, AC = ctx.adapter, ctx.autocast
    xw = 4  # x * w_norm: the buffer is fp32 (peft upcasts it with the adapters), the product promoted
    E = AC or A  # h's dtype
    S = max(E, A)  # h * scaling's
    per = operand(i, xw, ctx) + r * E + operand(r, S, ctx)
    fixed = 6 * r * A + A + ((r * i + layer.out_features * r) * AC if AC and A != AC else 0)
    return _dropout(layer, spec.setting("module_dropout", 0.0)) + Saved(per_token=per, fixed=fixed)


def gralora(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``GraloraLayer``'s Linear forward: ``dropout(x.to(A))`` (a copy when the dtypes differ; dropout's mask
    and output), the two einsums (each keeps its per-token operand: that tensor, then the ``(tokens, k, r)``
    regrouped product), the hybrid LoRA (``dropout(x.to(A))`` made again, with a mask of its own, and its
    ``(tokens, hybrid_r)`` product). Under autocast the stacked factors (leaves) are cast for the einsums'
    matmuls and kept."""
    k, _, r = layer.shape("gralora_A")
    i = layer.in_features
    elem, is_input = adapter_input(ctx)
    E = out_elem(ctx)
    p = spec.setting("gralora_dropout", 0.0) or 0.0
    path = _dropout(layer, p) + matmul_input(elem, is_input and not p > 0, i, ctx)
    saved = path + Saved(per_token=k * r * E, fixed=(i * r + r * layer.out_features) * ctx.autocast
                         if ctx.autocast and ctx.adapter != ctx.autocast else 0)
    if layer.has("gralora_A_general"):
        saved += path + Saved(per_token=layer.shape("gralora_A_general")[0] * E)
    return saved


def randlora(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``F.linear(F.linear(dropout(x.to(fp32)), first), second) * scaling`` (``RandLoraLayer``): the trained
    ``UA = lambda * A * gamma`` ``(r * bases, min)`` (``UniqueBaseGrad``, fp32: the bases are fp32 buffers)
    and the slice ``UB`` ``(max, bases * r)`` of the shared ``randlora_B`` (a view of the buffer). With ``in <= out``: ``x @ UA.T`` keeps ``x`` (fp32) and ``UA``
    (for the input's gradient), ``. @ UB.T`` keeps ``UB`` only (no gradient of its own); with ``in > out``:
    ``x @ UB`` keeps ``UB`` for the input's gradient, ``h @ UA`` keeps ``h`` ``(tokens, bases * r)`` and
    ``UA``. Under autocast the kept operands are the linears' 16-bit copies (none is a cached leaf)."""
    i, o = layer.in_features, layer.out_features
    r, nb = layer.shape("randlora_lambda")
    mn, mx = min(i, o), max(i, o)
    AC = ctx.autocast
    K = AC or 4  # a kept operand's bytes
    ua = r * nb * mn * K
    ub = mx * nb * r * AC if AC else 0  # else a view of the buffer (its last dim is whole: flatten is a view)
    p = spec.setting("randlora_dropout", 0.0) or 0.0
    saved = _dropout(layer, p)
    if i <= o:
        if AC or p > 0 or ctx.stream != 4:
            saved += Saved(per_token=i * K)
        else:
            saved += Saved(keeps_input=True)
        return saved + Saved(fixed=ub + ua, fixed_grad_only=ua)
    return saved + Saved(per_token=nb * r * K, fixed=ub + ua, fixed_grad_only=ub + ua)


FORMULAS = {"road": road, "c3a": c3a, "randlora": randlora, "shira": shira, "delora": delora, "gralora": gralora, "ia3": ia3, "loha": loha, "lokr": lokr, "oft": oft, "boft": boft, "hra": hra, "vera": vera, "pvera": pvera, "tinylora": tinylora, "unilora": unilora, "supertuning": supertuning, "psoft": psoft, "poly": poly,
            "fourierft": fourierft, "waveft": waveft, "miss": miss, "vblora": vblora, "ln_tuning": ln_tuning,
            "osf": osf, "trainable_tokens": trainable_tokens}
