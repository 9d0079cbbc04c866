"""LN tuning: a trained copy of each target module (LayerNorms by default), the original frozen
(peft 0.21 ``tuners/ln_tuning/layer.py``: ``LNTuningLayer.update_layer`` deep-copies the module)."""

from __future__ import annotations

from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners import defaults
from memfit.core.peft.tuners.base import EXCLUDE, MODULES_TO_SAVE, TARGETS, Settings, Tuner, keys


def ln_tuning_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """``ln_tuning_layers.default.<leaf>`` for every parameter of the module (its deepcopy)."""
    return [AdapterTensor(f"ln_tuning_layers.{ADAPTER_NAME}.{p.name.rsplit('.', 1)[-1]}", p.shape) for p in layer.params]


TUNER = Tuner(
    peft_type="LN_TUNING", method="ln_tuning", prefix="ln_tuning_", source="peft/tuners/ln_tuning/layer.py",
    targets=defaults.LNTUNING, kinds=frozenset({"norm", "linear", "conv1d", "embedding", "other"}),
    keys=keys(target_modules=TARGETS, exclude_modules=EXCLUDE, modules_to_save=MODULES_TO_SAVE),
    tensors=ln_tuning_tensors,
)
