"""VeRA: frozen random projections shared by every adapted layer, and two trained scaling vectors per
layer (peft 0.21 ``tuners/vera/``: ``VeraModel._find_dim`` / ``_init_vera_A_vera_B``,
``VeraLayer.update_layer``)."""

from __future__ import annotations

from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners import defaults
from memfit.core.peft.tuners.base import (FAN_IN_FAN_OUT, INIT, LAYERS, LAYERS_PATTERN, MODULES_TO_SAVE, TARGETS,
                                          Settings, Tuner, bias_key, free, keys, require, sized)


def vera_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """``vera_lambda_b (out,)``, ``vera_lambda_d (r,)``; the shared fp32 ``vera_A (r, max in)`` and
    ``vera_B (max out, r)`` over every target (persistent iff ``save_projection``)."""
    r = s["r"]
    require(r > 0, f"`r` should be a positive integer value but the value passed is {r}")
    max_in = max(t.in_features for t in layers)
    max_out = max(t.out_features for t in layers)
    keep = bool(s["save_projection"])
    at = f".{ADAPTER_NAME}"
    return [AdapterTensor("vera_lambda_b" + at, (layer.out_features,)),
            AdapterTensor("vera_lambda_d" + at, (r,)),
            AdapterTensor("vera_A" + at, (r, max_in), buffer="fp32", persistent=keep, shared="vera_A"),
            AdapterTensor("vera_B" + at, (max_out, r), buffer="fp32", persistent=keep, shared="vera_B")]


TUNER = Tuner(
    peft_type="VERA", method="vera", prefix="vera_lambda_", source="peft/tuners/vera/model.py, layer.py",
    targets=defaults.VERA, bias=True,
    keys=keys(
        r=sized("int", 256, "rank of the shared projections"),
        target_modules=TARGETS,
        projection_prng_key=free("int", 0, "seed of the projections"),
        save_projection=sized("bool", True, "the projections are persistent buffers (in the state dict)"),
        vera_dropout=sized("float", 0.0, "dropout on the adapter's input: a mask and a copy per layer"),
        d_initial=free("float", 0.1, "initial value of lambda_d"),
        fan_in_fan_out=FAN_IN_FAN_OUT, bias=bias_key("vera_"), modules_to_save=MODULES_TO_SAVE, init_weights=INIT,
        layers_to_transform=LAYERS, layers_pattern=LAYERS_PATTERN,
    ),
    tensors=vera_tensors,
)
