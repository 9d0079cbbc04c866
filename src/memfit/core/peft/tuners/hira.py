"""HiRA: the delta is the base weight times a rank-``r`` product, ``W * (B A)`` (Hadamard), so it is
high-rank with ``r (in + out)`` trained numbers per layer (peft 0.21.2 ``tuners/hira/``:
``HiraLayer.update_layer``, ``Embedding.update_layer``, ``dispatch_default``)."""

from __future__ import annotations

from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners import defaults
from memfit.core.peft.tuners.base import (EXCLUDE, FAN_IN_FAN_OUT, INIT, LAYERS, LAYERS_PATTERN, MODULES_TO_SAVE, TARGETS,
                                          Settings, Tuner, keys, note, require, sized)


def hira_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """Linear and Conv1D: ``hira_A (r, in)``, ``hira_B (out, r)``; Embedding: ``hira_embedding_A (r, vocab)``,
    ``hira_embedding_B (dim, r)`` (the ``ParameterDict``s in that order). ``r`` is the config's for every layer:
    ``dispatch_default`` builds a new layer with ``hira_config.r`` (the ``rank_pattern`` value
    ``_create_and_replace`` computes reaches only a layer that is a HiRA layer already)."""
    r = s["r"]
    require(r > 0, f"`r` should be a positive integer value but the value passed is {r}")
    at = f".{ADAPTER_NAME}"
    pre = "hira_embedding_" if layer.kind == "embedding" else "hira_"
    return [AdapterTensor(f"{pre}A{at}", (r, layer.in_features)), AdapterTensor(f"{pre}B{at}", (layer.out_features, r))]


TUNER = Tuner(
    peft_type="HIRA", method="hira", prefix="hira_", source="peft/tuners/hira/layer.py:HiraLayer.update_layer, "
    "dispatch_default",
    targets=defaults.LORA, kinds=frozenset({"linear", "conv1d", "embedding"}),
    keys=keys(
        r=sized("int", 32, "rank of the product that modulates the base weight"),
        target_modules=TARGETS, exclude_modules=EXCLUDE,
        hira_dropout=sized("float", 0.0, "dropout on the adapter's input: a mask and a copy per layer"),
        fan_in_fan_out=FAN_IN_FAN_OUT, modules_to_save=MODULES_TO_SAVE, init_weights=INIT,
        layers_to_transform=LAYERS, layers_pattern=LAYERS_PATTERN,
        rank_pattern=note("dict", {}, "peft 0.21.2 builds every new HiRA layer with r (dispatch_default reads "
                          "hira_config.r, not the rank_pattern value): memfit plans r, as peft builds it"),
    ),
    tensors=hira_tensors,
)
