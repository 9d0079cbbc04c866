"""BEFT: a trained bias vector added to the output of each adapted Linear (the value projections by
default) (peft 0.21.2 ``tuners/beft/``: ``BeftLayer.update_layer``, ``BeftModel._create_new_module``)."""

from __future__ import annotations

from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners import defaults
from memfit.core.peft.tuners.base import INIT, MODULES_TO_SAVE, TARGETS, Settings, Tuner, keys


def beft_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """``beft_bias (1, out)`` (``update_layer``: ``nn.Parameter(torch.randn((1, self.out_features)))``)."""
    return [AdapterTensor(f"beft_bias.{ADAPTER_NAME}", (1, layer.out_features))]


TUNER = Tuner(
    peft_type="BEFT", method="beft", prefix="beft_", source="peft/tuners/beft/layer.py:BeftLayer.update_layer",
    targets=defaults.BEFT, kinds=frozenset({"linear"}),  # _create_new_module: only torch.nn.Linear
    keys=keys(
        target_modules=TARGETS, modules_to_save=MODULES_TO_SAVE, init_weights=INIT,
    ),
    tensors=beft_tensors,
)
