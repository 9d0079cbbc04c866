"""LoRA and its variants (peft 0.21 ``tuners/lora/layer.py:Linear.forward``, ``variants.py``,
``dora.py:DoraLinearLayer.forward``), and AdaLoRA (``tuners/adalora/layer.py:SVDLinear.forward``).

LoRA: ``x = _cast_input_dtype(x, lora_A.dtype)``; ``result + lora_B(lora_A(dropout(x))) * scaling``.
``lora_A``'s matmul keeps its input (``x``, or the dropped copy), ``lora_B``'s the ``(tokens, r)``
output of ``lora_A``; dropout (CUDA ``native_dropout``) keeps a 1-byte mask per element.

DoRA adds, per layer: ``lora_result = lora_B(lora_A(x))`` and ``base_result`` (the base layer's
output, or with dropout ``F.linear(dropped, W)``), both ``(tokens, out)`` and kept by the two
products of ``result_dora = (m/||W'|| - 1) * base_result + (m/||W'||) * lora_result * s``; three
``(out,)`` vectors (the detached weight norm, ``m/||W'||`` and ``m/||W'|| - 1``); with dropout, the
base weight cast to the dropped input's dtype when they differ (kept by ``F.linear``: ``(out, in)``),
or always for a quantized base (``dequantize_module_weight``). Its forward transients (the identity
``x_eye (in, in)`` run through the adapter and ``W + s * B A`` for the norm) are freed by its end.

AdaLoRA: ``result += (dropout(x) @ (A * E).T @ B.T) * scaling / ranknum``: the input, the
``(r, in)`` product ``A * E`` and the ``(tokens, r)`` product (kept by ``@ B.T``).
"""

from __future__ import annotations

from memfit.core.activations.adapters import (AdaptedLayer, DtypeContext, Saved, adapter_input, matmul_input,
                                              out_elem)
from memfit.core.peft.spec import PeftSpec


def _dropout(spec: PeftSpec, layer: AdaptedLayer, elem: int, is_input: bool) -> tuple[Saved, int, bool]:
    """(the mask, element size and identity of what the adapter reads next)."""
    if spec.lora_dropout > 0:
        return Saved(per_token=layer.in_features, grad_only=layer.in_features), elem, False
    return Saved(), elem, is_input


def lora(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    if layer.has("lora_embedding_A"):  # F.embedding(ids, A.T) keeps the ids; B's matmul the (tokens, r) rows
        r = layer.shape("lora_embedding_A")[0]
        return Saved(per_token=r * out_elem(ctx))
    r = layer.shape("lora_A")[0]
    elem, is_input = adapter_input(ctx)
    mask, elem, is_input = _dropout(spec, layer, elem, is_input)
    saved = mask + matmul_input(elem, is_input, layer.in_features, ctx) + Saved(per_token=r * out_elem(ctx))
    if not spec.use_dora:
        return saved
    o = layer.out_features
    base_elem = ctx.autocast or (elem if spec.lora_dropout > 0 else ctx.stream)
    saved += Saved(per_token=o * out_elem(ctx) + o * base_elem, fixed=3 * o * ctx.adapter)
    if spec.lora_dropout > 0:  # base_result = F.linear(dropped, weight.to(dropped.dtype)) keeps that weight
        if ctx.autocast:  # cast again by autocast (a frozen weight is not cached), beside the base layer's own cast
            saved += Saved(fixed=o * layer.in_features * ctx.autocast)
        elif layer.quantized or (ctx.base or ctx.stream) != elem:
            saved += Saved(fixed=o * layer.in_features * elem)
    return saved


def adalora(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """Under autocast the ``B.T`` operand is a leaf's cast (cached and kept; ``lora_B`` is a bare
    parameter, not an ``nn.Linear``: not in the ledger's weight casts). ``/ ranknum`` keeps its
    ``(tokens, out)`` numerator when ``ranknum`` requires grad: it does after peft's upcast of a
    16-bit model re-created it (``DtypeContext.upcast``)."""
    r, i, o = layer.shape("lora_A")[0], layer.in_features, layer.out_features
    elem, is_input = adapter_input(ctx)
    dropout = spec.setting("lora_dropout", 0.0) or 0.0
    mask = Saved(per_token=i, grad_only=i) if dropout > 0 else Saved()
    if dropout > 0:
        is_input = False
    saved = mask + matmul_input(elem, is_input, i, ctx) + Saved(per_token=r * out_elem(ctx), fixed=r * i * out_elem(ctx))
    if ctx.autocast:
        saved += Saved(fixed=o * r * ctx.autocast)
    if ctx.upcast:
        saved += Saved(per_token=o * out_elem(ctx))
    return saved


FORMULAS = {"lora": lora, "adalora": adalora}
