"""DeLoRA: LoRA factors normalized per rank and bounded by a trained ``lambda``, scaled per input
channel by the base weight's column norms (peft 0.21 ``tuners/delora/``: ``DeloraLayer.update_layer``,
``reset_delora_parameters``; ``DeloraModel._create_and_replace`` reads ``rank_pattern``/``lambda_pattern``)."""

from __future__ import annotations

from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners import defaults
from memfit.core.peft.tuners.base import (
    EXCLUDE,
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
from memfit.core.peft.tuners.lycoris import pattern_value


def delora_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """``delora_A (r, in)``, ``delora_B (out, r)``, ``delora_lambda (1,)``; the persistent buffer
    ``delora_w_norm (in,)`` (``torch.norm(W, dim=0)``; fp32: on a 16-bit base peft upcasts it with the
    adapters, ``autocast_adapter_dtype``)."""
    r = pattern_value(layer.module, s["rank_pattern"], s["r"])
    require(r > 0, f"`r` should be a positive integer value but the value passed is {r}")
    at = f".{ADAPTER_NAME}"
    return [AdapterTensor("delora_A" + at, (r, layer.in_features)),
            AdapterTensor("delora_B" + at, (layer.out_features, r)),
            AdapterTensor("delora_lambda" + at, (1,)),
            AdapterTensor("delora_w_norm" + at, (layer.in_features,), buffer="fp32")]


TUNER = Tuner(
    peft_type="DELORA", method="delora", prefix="delora_", source="peft/tuners/delora/layer.py:DeloraLayer.update_layer",
    targets=defaults.LORA, kinds=frozenset({"linear"}), bias=True,
    keys=keys(
        r=sized("int", 8, "rank of the factors"),
        delora_lambda=free("int", 15, "initial bound of the delta's norm"),
        module_dropout=sized("float", 0.0, "dropout on the adapter's input: a mask per layer"),
        target_modules=TARGETS, exclude_modules=EXCLUDE, bias=bias_key("delora_"), init_weights=INIT,
        layers_to_transform=LAYERS, layers_pattern=LAYERS_PATTERN,
        rank_pattern=sized("dict", {}, "per-module r"),
        lambda_pattern=free("dict", {}, "per-module delora_lambda"),
        modules_to_save=MODULES_TO_SAVE,
    ),
    tensors=delora_tensors,
)
