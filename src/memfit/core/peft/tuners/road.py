"""RoAd: a 2D rotation and scale of each pair of the base layer's outputs, two trained vectors per layer
(peft 0.21 ``tuners/road/``: ``RoadLayer.update_layer``; the size is ``out / 2``, ``out`` or ``2 out`` for
the variants ``road_1``, ``road_2``, ``road_4``)."""

from __future__ import annotations

from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners import defaults
from memfit.core.peft.tuners.base import INIT, MODULES_TO_SAVE, TARGETS, Settings, Tuner, keys, require, sized

VARIANTS = {"road_1": (1, 2), "road_2": (1, 1), "road_4": (2, 1)}
"""variant -> (numerator, denominator) of the vectors' size over ``out_features``."""


def check(layer: Layer, s: Settings) -> None:
    g = s["group_size"]
    require(s["variant"] in VARIANTS, f"Unsupported variant {s['variant']} for RoadLayer. Supported variants are "
            "road_1, road_2, and road_4.")
    require(layer.out_features % g == 0, "The out_features of the base layer must be divisible by group_size "
            f"({g}) when using RoadLayer.")


def road_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """``road_theta``, ``road_alpha``: ``(size,)`` each."""
    num, den = VARIANTS[s["variant"]]
    size = layer.out_features * num // den
    at = f".{ADAPTER_NAME}"
    return [AdapterTensor("road_theta" + at, (size,)), AdapterTensor("road_alpha" + at, (size,))]


TUNER = Tuner(
    peft_type="ROAD", method="road", prefix="road_", source="peft/tuners/road/model.py, layer.py",
    targets=defaults.LORA, kinds=frozenset({"linear"}),
    keys=keys(
        variant=sized("str", "road_1", "the vectors' size: out/2, out or 2 out", choices=tuple(VARIANTS)),
        group_size=sized("int", 64, "pairs element j with j + group_size/2; out_features must divide by it"),
        init_weights=INIT,
        target_modules=TARGETS,
        modules_to_save=MODULES_TO_SAVE,
    ),
    tensors=road_tensors,
    check=check,
)
