"""GraLoRA: the adapted weight split into ``k x k`` sub-blocks, each with its own rank-``r/k`` LoRA
(stacked into two trained tensors), plus an optional plain LoRA of rank ``hybrid_r`` (peft 0.21
``tuners/gralora/``: ``GraloraLayer.update_layer``, ``GraloraConfig.__post_init__``)."""

from __future__ import annotations

from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners import defaults
from memfit.core.peft.tuners.base import (
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


def gralora_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """``gralora_A (k, in / k, r)``, ``gralora_B (k, r, out / k)`` (the stacked, transposed sub-block factors,
    wrapped as parameters by the ``ParameterDict``); with ``hybrid_r`` two ``nn.Linear`` without bias,
    ``gralora_A_general (hybrid_r, in)`` and ``gralora_B_general (out, hybrid_r)``."""
    r, k, h = s["r"], s["gralora_k"], s["hybrid_r"]
    require(k > 0, f"`gralora_k` should be a positive integer value but the value passed is {k}")
    require(r % k == 0, f"r should be divisible by gralora_k, but got {r} and {k}")
    require(r > 0, f"`r` should be a positive integer value but the value passed is {r}")
    require(h >= 0, f"`hybrid_r` should be a non-negative integer value but the value passed is {h}")
    i, o = layer.in_features, layer.out_features
    require(i % k == 0, f"in_features should be divisible by gralora_k, but got {i} and {k} ({layer.module})")
    require(o % k == 0, f"out_features should be divisible by gralora_k, but got {o} and {k} ({layer.module})")
    at = f".{ADAPTER_NAME}"
    out = [AdapterTensor("gralora_A" + at, (k, i // k, r)), AdapterTensor("gralora_B" + at, (k, r, o // k))]
    if h > 0:
        out += [AdapterTensor(f"gralora_A_general{at}.weight", (h, i)),
                AdapterTensor(f"gralora_B_general{at}.weight", (o, h))]
    return out


TUNER = Tuner(
    peft_type="GRALORA", method="gralora", prefix="gralora_", source="peft/tuners/gralora/layer.py:GraloraLayer.update_layer",
    targets=defaults.LORA, bias=True,
    keys=keys(
        r=sized("int", 32, "rank of each row of sub-blocks (r / k per sub-block)"),
        hybrid_r=sized("int", 0, "rank of the plain LoRA beside the sub-blocks"),
        target_modules=TARGETS,
        alpha=free("int", 64, "scales the delta only"),
        gralora_dropout=sized("float", 0.0, "dropout on the adapter's input: a mask and a copy per layer"),
        gralora_k=sized("int", 2, "sub-blocks per side"),
        fan_in_fan_out=FAN_IN_FAN_OUT, bias=bias_key("gralora_"), modules_to_save=MODULES_TO_SAVE, init_weights=INIT,
        layers_to_transform=LAYERS, layers_pattern=LAYERS_PATTERN,
    ),
    tensors=gralora_tensors,
)
