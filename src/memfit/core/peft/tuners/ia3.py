"""(IA)^3: one learned vector per adapted layer, scaling its output (or, for a feedforward layer, its
input) (peft 0.21 ``tuners/ia3/``: ``IA3Layer.update_layer``, ``IA3Model._create_and_replace``,
``_prepare_adapter_config``)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners import defaults
from memfit.errors import MemfitError
from memfit.core.peft.tuners.base import (EXCLUDE, FAN_IN_FAN_OUT, MODULES_TO_SAVE, TARGETS, Settings, Tuner, free,
                                          keys, sized)


def is_feedforward(module: str, s: Settings) -> bool:
    """``IA3Model._check_target_module_feedforward``: a string is ``re.fullmatch``ed, a list entry
    matches when the module name ends with it (no dot needed); no value: peft's default for the
    model type."""
    ff = s["feedforward_modules"]
    if ff is None:
        if s.model_type not in defaults.IA3_FEEDFORWARD:
            raise MemfitError(f"peft has no default IA3 feedforward_modules for model type {s.model_type!r}; give "
                              "feedforward_modules")
        ff = defaults.IA3_FEEDFORWARD[s.model_type]
    if isinstance(ff, str):
        return re.fullmatch(ff, module) is not None
    return any(module.endswith(k) for k in ff)


def ia3_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """``ia3_l``: ``(1, in)`` for a feedforward layer (it scales the input), else ``(out, 1)``."""
    shape = (1, layer.in_features) if is_feedforward(layer.module, s) else (layer.out_features, 1)
    return [AdapterTensor(f"ia3_l.{ADAPTER_NAME}", shape)]


TUNER = Tuner(
    peft_type="IA3", method="ia3", prefix="ia3_", source="peft/tuners/ia3/layer.py:IA3Layer.update_layer",
    targets=defaults.IA3,
    keys=keys(
        target_modules=TARGETS,
        exclude_modules=EXCLUDE,
        feedforward_modules=sized("str_or_list", None, "layers whose input (not output) is scaled: ia3_l is (1, in)"),
        fan_in_fan_out=FAN_IN_FAN_OUT,
        modules_to_save=MODULES_TO_SAVE,
        init_ia3_weights=free("bool", True, "ones or random: same shapes"),
    ),
    tensors=ia3_tensors,
)
