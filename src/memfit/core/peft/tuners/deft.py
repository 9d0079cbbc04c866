"""DEFT: the adapted weight ``(I - P_proj) W + Q_P R`` with a trained projection direction ``P (out, r)``
and injection ``R (r, in)`` (peft 0.21.2 ``tuners/deft/``: ``DeftLayer.update_layer``,
``DeftModel._create_new_module``)."""

from __future__ import annotations

from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners import defaults
from memfit.core.peft.tuners.base import (
    EXCLUDE,
    FAN_IN_FAN_OUT,
    INIT,
    LAYERS,
    LAYERS_PATTERN,
    MODULES_TO_SAVE,
    TARGETS,
    Settings,
    Tuner,
    bias_key,
    free,
    keys,
    require,
    sized,
)


def deft_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """``deft_P (out, r)`` and, unless ``para``, ``deft_R (r, in)``, with ``r = min(r, out)`` (``update_layer``:
    the projection has rank at most ``out``). ``_cached_merge_factor`` is a non-persistent ``BufferDict`` that only
    ``merge`` fills; the dropout is an ``nn.Dropout`` (no tensors)."""
    require(s["r"] > 0, f"`r` should be a positive integer value but the value passed is {s['r']}")
    r = min(s["r"], layer.out_features)
    at = f".{ADAPTER_NAME}"
    out = [AdapterTensor("deft_P" + at, (layer.out_features, r))]
    if not s["para"]:
        out.append(AdapterTensor("deft_R" + at, (r, layer.in_features)))
    return out


TUNER = Tuner(
    peft_type="DEFT", method="deft", prefix="deft_", source="peft/tuners/deft/layer.py:DeftLayer.update_layer",
    targets=defaults.LORA, bias=True,  # _create_new_module: nn.Linear and transformers' Conv1D
    keys=keys(
        r=sized("int", 8, "rank of P and R"),
        target_modules=TARGETS, exclude_modules=EXCLUDE,
        decomposition_method=sized("str", "relu", "P_proj from relu(P) or from P's QR: what the forward keeps",
                                   choices=("relu", "qr")),
        init_scale=free("float", 1.0, "std of R's random init (init_weights=False)"),
        alpha=free("int", None, "scales the injection only (alpha / r)"),
        para=sized("bool", False, "PaRa: subspace removal only, no R"),
        fan_in_fan_out=FAN_IN_FAN_OUT,
        deft_dropout=sized("float", 0.0, "dropout on the injection's input: a mask and a copy per layer"),
        init_weights=INIT, layers_to_transform=LAYERS, layers_pattern=LAYERS_PATTERN, bias=bias_key("deft_"),
        modules_to_save=MODULES_TO_SAVE,
    ),
    tensors=deft_tensors,
)
