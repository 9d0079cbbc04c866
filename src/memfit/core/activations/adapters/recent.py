"""The saved tensors of tuners peft added in its latest releases (BEFT, PEANuT, ...), each read from its
layer's ``forward`` in peft 0.21.2 (``tuners/<tuner>/layer.py``) and checked against that layer traced on
CPU tensors (``tests/trace/test_adapter_layers_vs_trace.py``). Sizes and letters as in ``others.py``:
``i``/``o`` the layer's in/out widths, ``A`` the adapter's element size, ``E`` a matmul's output element
size (autocast's under AMP, else the adapter's).
"""

from __future__ import annotations

from memfit.core.activations.adapters import AdaptedLayer, DtypeContext, Saved, adapter_input, matmul_input, out_elem
from memfit.core.activations.adapters.others import _dropout, operand
from memfit.core.peft.spec import PeftSpec


def beft(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``(base(x) + beft_bias.flatten()).to(result dtype)`` (``tuners/beft/layer.py`` ``Linear.forward``): an add's
    backward needs neither operand, the flatten is a view and the cast keeps nothing."""
    return Saved()


def peanut(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``Linear._compute_delta_weight`` then ``matmul(x.to(delta), delta.T)`` (``tuners/peanut/layer.py``):
    ``W.T.to(A) @ A.T`` keeps ``W.T`` for A's gradient (a copy when the base's dtype is not the adapter's, or
    autocast's 16-bit copy); each ``(in, r)`` step of the network keeps what its nodes need: an activation
    keeping its output (``relu``) shares it with the next linear's input, one keeping its input (``gelu``)
    keeps the pre-activation besides; each decoder's residual sum is the next linear's input
    (``1 + 3 depth`` tensors, or ``2 + 4 depth``); ``delta * scaling`` ``(in, out)`` is kept by the last matmul
    for the input's gradient, with ``x`` cast to the delta's dtype. Under autocast the casts of A, B and the
    r x r weights (each an ``nn.Linear``'s weight) are the ledger's ``amp.weight_casts``."""
    from memfit.core.peft.tuners.peanut import SAVES_OUTPUT

    i, o = layer.in_features, layer.out_features
    r = layer.shape("peanut_A")[0]
    depth = sum(1 for k in layer.tensors if k.startswith("peanut_encoders."))
    A, AC = ctx.adapter, ctx.autocast
    E = out_elem(ctx)
    base = ctx.base or ctx.stream
    w_t = operand(i * o, A, ctx) if base != A or (AC and A != AC) else 0
    steps = 1 + 3 * depth if spec.setting("act_fn", "relu") in SAVES_OUTPUT else 2 + 4 * depth
    delta = i * o * E
    return matmul_input(E, ctx.stream == E, i, ctx) + Saved(fixed=w_t + steps * i * r * E + delta,
                                                            fixed_grad_only=delta)


def lily(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``LilyLayer``'s Linear forward (``tuners/lily/layer.py``): ``hidden = lily_A(x.to(A))`` keeps ``x`` (a copy
    when the dtypes differ), ``router(hidden)`` and ``matmul(hidden, combined_B)`` keep ``hidden`` ``(tokens, r)``;
    the softmax keeps its ``(tokens, num_B)`` output; the mean over the tokens keeps nothing; ``einsum('e,eio->io',
    p, B)`` keeps the ``(num_B,)`` mixture (``B`` is a view of ``lily_B.weight``) and ``combined_B`` ``(r, out)`` is
    kept by the last matmul for ``hidden``'s gradient."""
    i, o = layer.in_features, layer.out_features
    num_b, r = layer.shape("lily_router")  # the layer's own (A and B are named where they are first met)
    elem, is_input = adapter_input(ctx)
    E = out_elem(ctx)
    return matmul_input(elem, is_input, i, ctx) + Saved(per_token=r * E + num_b * E, fixed=num_b * E + r * o * E)


def glora(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``GloraLinear.forward`` (``tuners/glora/layer.py``): ``F.linear(x, W + W * A + B, bias_eff)``: the rebuilt
    ``(out, in)`` weight in the base's dtype is kept for the input's gradient, and ``x`` for the weight's when it
    trains (A and B not zeros buffers); ``W * A`` keeps only ``W`` (a parameter), the paths' casts to the base's
    dtype keep nothing. Under autocast the low-rank paths' factors (leaves: cached casts) are kept by their
    products, the rebuilt weight's 16-bit copy by ``F.linear``; with a trained C, ``W @ C`` keeps ``W``'s 16-bit copy
    (a frozen parameter: not cached) and a low-rank C its factors' copies."""
    i, o = layer.in_features, layer.out_features
    A, AC = ctx.adapter, ctx.autocast
    base = ctx.base or ctx.stream
    weight = operand(o * i, base, ctx)
    saved = Saved(fixed=weight, fixed_grad_only=weight)
    if not layer.has("glora_A.default.zeros"):
        saved += matmul_input(ctx.stream, True, i, ctx)
    factors = AC if AC and A != AC else 0
    for path in ("glora_A", "glora_B", "glora_C"):
        if layer.has(f"{path}.default.Xd"):
            (m, r), (_, n) = layer.shape(f"{path}.default.Xd"), layer.shape(f"{path}.default.Xu")
            saved += Saved(fixed=(m * r + r * n) * factors)
    if AC and base != AC and not layer.has("glora_C.default.zeros"):
        saved += Saved(fixed=o * i * AC)
    return saved


def deft(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``DeftLinear.forward`` (``tuners/deft/layer.py``), in fp32 (``compute_dtype``): the base output cast to fp32
    (minus the bias) is the bias-free product that ``@ right`` keeps ``(tokens, out)``; ``_project`` keeps
    ``relu(P)`` (``relu``) or the QR's ``Q`` and ``R`` (``qr``); each ``(tokens, r) @ Q_P.T`` keeps its product and
    ``Q_P`` (a copy when ``P`` is not fp32); the injection ``F.linear(dropout(x.to(fp32)), R.to(fp32) * scaling)``
    keeps its input (``x`` itself when fp32 without dropout; dropout's mask), the scaled ``R`` ``(r, in)`` for the
    input's gradient and its ``(tokens, r)`` product. Under autocast each matmul keeps 16-bit copies of its
    operands instead (none cached: ``Q_P.T`` is a view, not a leaf)."""
    i, o = layer.in_features, layer.out_features
    r = layer.shape("deft_P")[1]
    A, AC = ctx.adapter, ctx.autocast
    para = not layer.has("deft_R")
    qr = spec.setting("decomposition_method", "relu") == "qr"
    p = spec.setting("deft_dropout", 0.0) or 0.0
    K = AC or 4  # a kept matmul operand's bytes
    uses = 1 if para else 2  # the products reading Q_P.T
    saved = Saved(per_token=o * K + r * K * uses)
    if qr:  # linalg.qr keeps Q and R; Q is both right and Q_P
        fixed = (o * r + r * r) * 4 + (1 + uses) * o * r * AC
    else:
        fixed = o * r * 4 + o * r * AC  # relu(P), and right's 16-bit copy under autocast
        if AC:  # Q_P.T's copies: a transposed view is no leaf, so autocast caches none of them
            fixed += o * r * AC * uses
        elif A != 4:
            fixed += o * r * 4  # P.to(fp32)
    saved += Saved(fixed=fixed)
    if para:
        return saved
    scaled = r * i * K
    saved += Saved(fixed=scaled, fixed_grad_only=scaled) + _dropout(layer, p)
    if AC or p > 0 or ctx.stream != 4:
        return saved + Saved(per_token=i * K)
    return saved + Saved(keeps_input=True)


def frod(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """FRoD's ``Linear.forward`` (``tuners/frod/layer.py``), everything in the input's dtype: ``z = x @ V`` (a buffer:
    nothing of ``x`` is kept; under autocast ``V``'s 16-bit copy), ``z @ S`` (16-bit ``z``: ``S.to_dense()`` ``(in,
    in)``, kept by the matmul; fp32: ``torch.sparse.mm`` keeps the coalesced sparse ``S``, its int64 indices and
    values; ``to_dense`` keeps it too), ``z * lambda`` (keeps ``z`` ``(tokens, in)`` and ``lambda``, a copy when its
    dtype is not the input's, as the values are copied), ``F.linear(., U)`` (``U`` a buffer, its 16-bit copy under autocast). Without dropout the base layer
    does not run; with it the base layer runs on ``x`` and ``F.linear(dropout(x), W)`` is subtracted (keeping
    ``W``'s 16-bit copy under autocast, and dropout's mask)."""
    i, o = layer.in_features, layer.out_features
    # the input's dtype is the base weight's (the model's: the stream that reaches a Linear); read from the base so
    # the weight-sized terms stay one tensor each when the ledger splits the estimate (memfit.core.activations.tensors)
    base = ctx.base or ctx.stream
    D, A, AC = base, ctx.adapter, ctx.autocast
    nnz = layer.shape("frod_lambda_s_values")[0]
    z = AC or D
    v = i * i * AC if AC and base != AC else 0  # V (the base's dtype) cast for x @ V, kept for x's gradient
    s_dense = operand(i * i, D, ctx) if z != 4 else 0  # S.to_dense() (or its 16-bit copy), kept for z's gradient
    grad_only = v + s_dense
    fixed = grad_only
    fixed += nnz * (16 + D)  # the coalesced S (int64 (2, nnz) indices, values): kept by sparse.mm or by to_dense
    if A != D:
        fixed += i * D + nnz * D  # lambda_l.to(x.dtype), and the values' copy the sparse tensor is built from
    if AC and D != AC:
        fixed += o * i * AC  # U.to(x.dtype) cast for F.linear
    saved = Saved(per_token=i * z, fixed=fixed, fixed_grad_only=grad_only)
    p = spec.setting("frod_dropout", 0.0) or 0.0
    if p > 0:
        w = o * i * AC if AC and base != AC else 0
        saved += _dropout(layer, p) + Saved(fixed=w, fixed_grad_only=w)
    return saved


def hira(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """HiRA's ``Linear.forward`` (``tuners/hira/layer.py``): ``mm(A.T, B.T)`` keeps only the parameters (under
    autocast the 16-bit copies of the transposed views, which are no leaves: not cached); ``x.to(A)`` and its
    dropout (mask); ``F.linear(dropout(x), W * prod.T)`` keeps its input and the modulated ``(out, in)`` weight (in
    the promoted dtype of the base and the adapter; its 16-bit copy under autocast) for the input's gradient;
    ``W * prod.T`` keeps ``W`` (a parameter) only. Embedding: ``F.embedding`` of the modulated weight keeps the
    ids only; under autocast ``mm(B, A)`` keeps its factors' cached copies."""
    i, o = layer.in_features, layer.out_features
    A, AC = ctx.adapter, ctx.autocast
    factors = AC if AC and A != AC else 0
    if layer.has("hira_embedding_A"):
        (r, n), (d, _) = layer.shape("hira_embedding_A"), layer.shape("hira_embedding_B")
        return Saved(fixed=(r * n + d * r) * factors)
    r = layer.shape("hira_A")[0]
    base = ctx.base or ctx.stream
    weight = operand(o * i, max(base, A), ctx)
    p = spec.setting("hira_dropout", 0.0) or 0.0
    elem, is_input = adapter_input(ctx)
    return (_dropout(layer, p) + matmul_input(elem, is_input and not p > 0, i, ctx)
            + Saved(fixed=weight + (r * i + o * r) * factors, fixed_grad_only=weight))




def adamss(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """``AdamssLayer``'s Linear forward (peft 0.21.2 ``tuners/adamss/layer.py``), in ``D``, the base weight's dtype
    (``self.dtype``; ``P``: a matmul's output, autocast's or ``D``): ``projected = F.linear(x.to(D) [| 1],
    newB.to(D))`` keeps nothing of ``x`` (``newB`` is a buffer, fp32: ``cast_adapter_dtype`` upcasts a BufferDict's
    16-bit entries and DeepSpeed's cast leaves buffers), and for the input's gradient ``newB``'s ``D`` copy (or
    autocast's 16-bit one); each of the ``K`` subspaces' ``F.linear(projected, A_i.to(D))`` keeps ``projected``
    ``(tokens, r)`` (one tensor for all ``K``) and, for ``projected``'s gradient, ``A_i``'s cast when it is one;
    ``F.linear(h_i, B_i.to(D))`` keeps ``h_i`` ``(tokens, 1)`` and ``B_i``'s cast (``out`` rows in all); the
    ``scatter`` into the output's order keeps its int64 index, ``scatter_index.to(device)``: a plain dict attribute
    that ``model.to()`` does not move, so on CUDA a copy of ``out`` int64 per forward (on the CPU the tensor
    itself); the cat, the add and the casts keep nothing."""
    o = layer.out_features
    i = layer.in_features + (1 if layer.bias else 0)
    k = sum(1 for name in layer.tensors if name.startswith("adamss_A."))
    r = layer.shape("adamss_A")[1]
    D, AC = ctx.base or ctx.stream, ctx.autocast
    P = AC or D
    cast = ctx.adapter != D or bool(AC and AC != D)  # A_i.to(D) (or autocast's copy) is not the parameter itself
    a_cast = k * operand(r, D, ctx) if cast else 0
    b_cast = operand(o, D, ctx) if cast else 0
    new_b = operand(r * i, D, ctx) if D != 4 or (AC and AC != D) else 0  # newB (fp32) is not kept itself
    index = 8 * o
    return Saved(per_token=(r + k) * P, fixed=index + b_cast + a_cast + new_b, fixed_grad_only=a_cast + new_b)


FORMULAS = {"beft": beft, "frod": frod, "hira": hira, "peanut": peanut, "lily": lily, "glora": glora, "deft": deft,
            "adamss": adamss}
