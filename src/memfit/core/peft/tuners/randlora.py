"""RandLoRA: frozen random bases shared by every adapted layer (``randlora_A (r, 1, min)``, ``randlora_B
(max, bases, r)`` over the largest target shape) and two trained scalings per layer (peft 0.21
``tuners/randlora/``: ``RandLoraModel._find_dim`` / ``_init_randlora_A_randlora_B``,
``RandLoraLayer.update_layer``)."""

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


def bases(dim: int, r: int) -> int:
    """``ceil(dim / r)``: the bases for full rank (``num_bases``)."""
    return -(-dim // r)


def randlora_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """``randlora_lambda (r, bases)``, ``randlora_gamma (bases, min(in, out))``; the shared fp32 bases,
    from the elementwise largest ``(out, in)`` of the targets (persistent iff ``save_projection``)."""
    r = s["r"]
    require(r > 0, f"`r` should be a positive integer value but the value passed is {r}")
    out_max = max(t.out_features for t in layers)
    in_max = max(t.in_features for t in layers)
    hi, lo = max(out_max, in_max), min(out_max, in_max)
    mn = min(layer.in_features, layer.out_features)
    nb = bases(mn, r)
    keep = bool(s["save_projection"])
    at = f".{ADAPTER_NAME}"
    return [AdapterTensor("randlora_lambda" + at, (r, nb)),
            AdapterTensor("randlora_gamma" + at, (nb, mn)),
            AdapterTensor("randlora_A" + at, (r, 1, lo), buffer="fp32", persistent=keep, shared="randlora_A"),
            AdapterTensor("randlora_B" + at, (hi, bases(lo, r), r), buffer="fp32", persistent=keep,
                          shared="randlora_B")]


TUNER = Tuner(
    peft_type="RANDLORA", method="randlora", prefix="randlora_", source="peft/tuners/randlora/model.py, layer.py",
    targets=defaults.LORA, bias=True,
    keys=keys(
        r=sized("int", 32, "rank of each random basis"),
        target_modules=TARGETS,
        projection_prng_key=free("int", 0, "seed of the bases"),
        save_projection=sized("bool", True, "the bases are persistent buffers (in the state dict)"),
        sparse=free("bool", False, "ternary bases: same shapes"),
        very_sparse=free("bool", False, "sparser ternary bases: same shapes"),
        randlora_dropout=sized("float", 0.0, "dropout on the adapter's input: a mask and a copy per layer"),
        fan_in_fan_out=FAN_IN_FAN_OUT,
        randlora_alpha=free("int", 640, "scales the delta only"),
        bias=bias_key("randlora_"), modules_to_save=MODULES_TO_SAVE, init_weights=INIT,
        layers_to_transform=LAYERS, layers_pattern=LAYERS_PATTERN,
    ),
    tensors=randlora_tensors,
)
