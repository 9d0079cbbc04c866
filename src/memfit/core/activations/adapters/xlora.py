"""X-LoRA's saved tensors (peft 0.21.2 ``tuners/xlora/``), per adapted layer and for the whole model.

The forward (``XLoraModel._enable_peft_forward_hooks._pre_forward``) first runs the model under
``torch.no_grad()`` with ``output_hidden_states`` (the scaling pass: every hidden state and the logits live
until it ends; nothing is kept for backward), then the classifier on its last hidden state, then the model
again with every layer's experts scaled per token (``layer.py:XLoraLinearLayer.forward``)::

    x = x.to(lora_A.weight.dtype)
    x_mod = x * scalings[:, :, layer, expert].unsqueeze(-1)
    result += lora_B(lora_A(dropout(x_mod))) * scaling * global_scaling_weight

Per adapted layer: the product keeps ``x`` for the scalings' gradient (the layer input itself, or its cast
copy: one per layer, the experts share it) and a view of the scalings (the classifier's tensor, counted
once below); each expert's dropout (its ``lora_dropout``) keeps a 1-byte mask: ``x_mod`` requires grad
through the scalings in every layer, the first block's too; frozen experts' matmuls keep nothing else (their
weights need no gradient). Trained experts (``use_trainable_adapters``) keep what LoRA's keep: ``lora_A``'s
input (``x_mod`` or the dropped copy, per expert) and its ``(tokens, r)`` output.

The whole model, before the blocks (``classifier.py:XLoraClassifier.forward``, its dtype the base's): the
first Linear keeps the last hidden state (in the stream's dtype, from the no-grad pass); each hidden layer
of width ``xlora_size`` keeps its ReLU output and, with ``xlora_dropout_p > 0``, the dropout's mask and
output (the next Linear's input); the scalings are kept once, whose views every layer's product keeps: the
softmax's ``(tokens, layers, experts)`` output, or without softmax the logits themselves (``(tokens, experts)``
unless ``layerwise_scalings``: ``reshape`` of the expanded view to its own shape is a view).
"""

from __future__ import annotations

from memfit.core.activations.adapters import (AdaptedLayer, AdapterActivations, DtypeContext, Saved, adapter_input,
                                              matmul_input, out_elem)
from memfit.core.peft.spec import PeftSpec


def _experts(layer: AdaptedLayer) -> list[tuple[int, int]]:
    """(expert index, rank) of each expert adapting ``layer``, in peft's order."""
    out = []
    for key, shape in layer.tensors.items():
        parts = key.split(".")
        if parts[0] == "lora_A" and len(parts) == 3 and parts[1].isdigit():
            out.append((int(parts[1]), shape[0]))
    return out


def xlora(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    elem, is_input = adapter_input(ctx)
    saved = Saved(keeps_input=True) if is_input else Saved(per_token=layer.in_features * elem)
    trained = bool(spec.setting("use_trainable_adapters", False))
    for i, r in _experts(layer):
        dropout = spec.experts[i].lora_dropout if i < len(spec.experts) else 0.0
        if dropout > 0:
            saved += Saved(per_token=layer.in_features)
        if trained:  # lora_A keeps x_mod (or the dropped copy), lora_B the (tokens, r) product
            saved += matmul_input(elem, False, layer.in_features, ctx) + Saved(per_token=r * out_elem(ctx))
    return saved


def classifier(acts: AdapterActivations, ctx: DtypeContext) -> Saved:
    """The classifier's and the scalings' tensors (module doc), per token."""
    spec = acts.spec
    n, L = len(spec.experts), len(acts.layers)
    c = ctx.autocast or ctx.base or ctx.stream
    h = acts.layers[0].in_features if not spec.setting("hidden_size") else spec.setting("hidden_size")
    per = matmul_input(ctx.stream, False, h, ctx).per_token
    depth = spec.setting("xlora_depth", 1)
    size = spec.setting("xlora_size", 2048)
    dropout = spec.setting("xlora_dropout_p", 0.2) or 0.0
    for _ in range(depth - 1):
        per += size * c + ((size + size * c) if dropout > 0 else 0)
    if spec.setting("enable_softmax", True):  # softmax keeps its (tokens, layers, experts) output (fp32 under autocast)
        per += L * n * (4 if ctx.autocast else c)
    else:  # the logits themselves: reshape of the expanded (tokens, 1 -> layers, experts) view is a view
        per += (L * n if spec.setting("layerwise_scalings", False) else n) * c
    return Saved(per_token=per)


NO_KV_CACHE = frozenset({"xlora"})
"""``XLoraModel.__init__`` raises ``use_cache must be False``: the model is trained without a key/value cache."""
FORMULAS = {"xlora": xlora}
MODEL_FORMULAS = {"xlora": classifier}
