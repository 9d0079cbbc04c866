"""C3A: a trained block-circulant kernel per adapted Linear, applied by FFTs (peft 0.21 ``tuners/c3a/``:
``C3ALayer.update_layer``, ``C3AModel._create_and_replace``, ``utils.py:BlockCircularConvolution``)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners import defaults
from memfit.core.peft.tuners.base import (
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


def block_size(layer: Layer, s: Settings) -> int:
    """``block_size_pattern``'s first key ``k`` with ``re.match(rf".*\\.{k}$", key)`` (C3A's own match, not
    ``get_pattern_key``), else ``block_size``; peft's refusals in ``update_layer``."""
    b = next((v for k, v in (s["block_size_pattern"] or ()) if re.match(rf".*\.{k}$", layer.module)), s["block_size"])
    require(b > 0, f"`block_size` should be a positive integer value but the value passed is {b}")
    require(layer.in_features % b == 0, "The block size should be a factor of the input size. However, the input "
            f"size is {layer.in_features} and the block size is {b} ({layer.module})")
    require(layer.out_features % b == 0, "The block size should be a factor of the output size. However, the output "
            f"size is {layer.out_features} and the block size is {b} ({layer.module})")
    return b


def c3a_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """``c3a_kernel (out // b, in // b, b)``, fp32."""
    b = block_size(layer, s)
    return [AdapterTensor(f"c3a_kernel.{ADAPTER_NAME}", (layer.out_features // b, layer.in_features // b, b))]


TUNER = Tuner(
    peft_type="C3A", method="c3a", prefix="c3a_", source="peft/tuners/c3a/layer.py:C3ALayer.update_layer",
    targets=defaults.C3A, kinds=frozenset({"linear"}), bias=True,
    keys=keys(
        block_size=sized("int", 256, "block of the circulant kernel: (out/b) x (in/b) x b trained per layer"),
        target_modules=TARGETS, bias=bias_key("c3a_"), modules_to_save=MODULES_TO_SAVE,
        layers_to_transform=LAYERS, layers_pattern=LAYERS_PATTERN,
        block_size_pattern=sized("dict", {}, "per-module block_size"),
        init_weights=free("any", "xavier_uniform", "zeros or random: same shapes",
                          choices=(True, False, "gaussian", "kaiming_uniform", "xavier_uniform")),
    ),
    tensors=c3a_tensors,
)
