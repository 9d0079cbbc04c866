"""SHiRA: a trained sparse set of ``r * (in + out)`` entries of each adapted weight, at random locations
(peft 0.21 ``tuners/shira/``: ``ShiraLayer.update_layer``, ``mask_functions.py:random_mask``); the
locations' int32 indices live in a plain dict attribute, not a buffer."""

from __future__ import annotations

from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners import defaults
from memfit.core.peft.tuners.base import (
    FAN_IN_FAN_OUT,
    INIT,
    MODULES_TO_SAVE,
    TARGETS,
    Settings,
    Tuner,
    free,
    keys,
    only,
    require,
    sized,
)


def shira_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """``shira_weight (r * (in + out),)``, fp32; peft's refusals in ``update_layer``."""
    r = s["r"]
    require(r > 0, f"`r` should be a positive integer value but the value passed is {r}")
    n = r * (layer.in_features + layer.out_features)
    require(n <= layer.in_features * layer.out_features,
            f"The set rank {r} results in more shira params than the total number of params in the base layer "
            f"{layer.in_features * layer.out_features} and this is not allowed. ({layer.module})")
    return [AdapterTensor(f"shira_weight.{ADAPTER_NAME}", (n,))]


TUNER = Tuner(
    peft_type="SHIRA", method="shira", prefix="shira_", source="peft/tuners/shira/layer.py:ShiraLayer.update_layer",
    targets=defaults.SHIRA, kinds=frozenset({"linear"}),
    keys=keys(
        r=sized("int", 32, "r x (in + out) sparse entries trained per layer"),
        mask_type=only("random", "a custom mask function (config.mask_fn) cannot be read from a file"),
        random_seed=free("int", None, "seed of the sparse locations", nullable=True),
        target_modules=TARGETS, fan_in_fan_out=FAN_IN_FAN_OUT, init_weights=INIT, modules_to_save=MODULES_TO_SAVE,
    ),
    tensors=shira_tensors,
)
