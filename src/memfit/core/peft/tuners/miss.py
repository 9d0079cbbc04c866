"""MiSS (formerly Bone): a trained block shared across the rows of each adapted layer (peft 0.21
``tuners/miss/layer.py``: ``MissLayer.update_layer``, ``reset_*_parameters``)."""

from __future__ import annotations

from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners import defaults
from memfit.core.peft.tuners.base import (EXCLUDE, LAYERS, LAYERS_PATTERN, MODULES_TO_SAVE, TARGETS, Settings, Tuner,
                                          bias_key, keys, require, sized)


def miss_shape(layer: Layer, s: Settings) -> tuple[int, ...]:
    """``miss_block``: ``(r, out)``; ``init_weights='bat'``: ``(out // r, r, r)``; ``'mini'``: ``(r, mini_r)``."""
    r, init = s["r"], s["init_weights"]
    require(r > 0, f"`r` should be a positive integer value but the value passed is {r}")
    require(r <= layer.in_features, f"`r` ({r}) must be less than or equal to in_features ({layer.in_features})")
    if init == "bat":
        require(layer.in_features % r == 0 and layer.out_features % r == 0,
                f"The weight matrix must be fully divisible into [r, r] blocks ({layer.module}).")
        return (layer.out_features // r, r, r)
    if init == "mini":
        require(layer.out_features % s["mini_r"] == 0,
                f"out_features ({layer.out_features}) must be divisible by mini_r ({s['mini_r']}) ({layer.module})")
        return (r, s["mini_r"])
    return (r, layer.out_features)


def miss_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    return [AdapterTensor(f"miss_block.{ADAPTER_NAME}", miss_shape(layer, s))]


TUNER = Tuner(
    peft_type="MISS", method="miss", prefix="miss_", source="peft/tuners/miss/layer.py:MissLayer.update_layer",
    targets=defaults.LORA, bias=True,
    keys=keys(
        r=sized("int", 64, "block rank"),
        miss_dropout=sized("float", 0.0, "dropout on the adapter's input: a mask and a copy per layer"),
        mini_r=sized("int", 1, "the block width with init_weights='mini'"),
        target_modules=TARGETS, exclude_modules=EXCLUDE,
        init_weights=sized("any", True, "True (MiSS), 'bat' (block-affine, rebuilds the whole weight per forward) "
                           "or 'mini'", choices=(True, False, "bat", "mini")),
        layers_to_transform=LAYERS, layers_pattern=LAYERS_PATTERN, bias=bias_key("miss_"),
        modules_to_save=MODULES_TO_SAVE,
    ),
    tensors=miss_tensors,
)
