"""PEANuT: a small network over the base weight makes the delta, ``B(act(... act(W.T @ A.T)))``, with
``depth`` encoder and decoder layers and residuals between them (peft 0.21.2 ``tuners/peanut/``:
``PeanutLayer.__init__`` / ``update_layer``, ``PeanutModel._create_new_module``)."""

from __future__ import annotations

from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners import defaults
from memfit.core.peft.tuners.base import (
    EXCLUDE,
    INIT,
    LAYERS,
    LAYERS_PATTERN,
    MODULES_TO_SAVE,
    TARGETS,
    Settings,
    Tuner,
    free,
    keys,
    require,
    sized,
)

SAVES_OUTPUT = frozenset({"relu", "tanh", "sigmoid"})
"""``ACT2FN`` entries that are one autograd node keeping their output (``nn.ReLU``, ``nn.Tanh``, ``nn.Sigmoid``):
the next linear keeps the same tensor."""
SAVES_INPUT = frozenset({"gelu", "silu", "swish"})
"""``ACT2FN`` entries that are one autograd node keeping their input (``GELUActivation`` -> ``F.gelu``,
``SiLUActivation``/``nn.SiLU`` -> ``F.silu``): the next linear keeps the output besides."""


def check_peanut(layer: Layer, s: Settings) -> None:
    """peft's refusals (``PeanutConfig.__post_init__``), and the activations memfit has the saved tensors of."""
    require(s["r"] > 0, "`r` must be a positive integer.")
    require(s["depth"] >= 0, "`depth` can only be a non-negative integer.")
    act = s["act_fn"]
    require(act in SAVES_OUTPUT | SAVES_INPUT, f"PEANUT setting act_fn={act!r} is not modelled by memfit (what its "
            f"autograd nodes keep is known for {', '.join(sorted(SAVES_OUTPUT | SAVES_INPUT))} only)")


def peanut_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """In ``named_parameters()`` order (the ``ModuleDict``s are registered A, B, encoders, decoders in
    ``PeanutLayer.__init__``): ``peanut_A (r, out)`` (``nn.Linear(self.out_features, r, bias=False)``: it reads
    the base weight's output dimension), ``peanut_B (out, r)``, ``depth`` encoders and ``depth`` decoders
    ``(r, r)`` (``nn.ModuleList([nn.Linear(r, r, bias=False) for _ in range(depth)])``)."""
    r, depth, o = s["r"], s["depth"], layer.out_features
    at = f".{ADAPTER_NAME}"
    return [AdapterTensor(f"peanut_A{at}.weight", (r, o)), AdapterTensor(f"peanut_B{at}.weight", (o, r)),
            *(AdapterTensor(f"peanut_encoders{at}.{i}.weight", (r, r)) for i in range(depth)),
            *(AdapterTensor(f"peanut_decoders{at}.{i}.weight", (r, r)) for i in range(depth))]


TUNER = Tuner(
    peft_type="PEANUT", method="peanut", prefix="peanut_", source="peft/tuners/peanut/layer.py:PeanutLayer.update_layer",
    targets=defaults.LORA, kinds=frozenset({"linear"}),  # _create_new_module: nn.Linear only
    keys=keys(
        r=sized("int", 32, "width of the network over the base weight"),
        depth=sized("int", 0, "encoder and decoder layers (r x r each) between A and B"),
        act_fn=sized("str", "relu", "the network's activation: what its autograd nodes keep"),
        scaling=free("float", 1.0, "scales the delta only"),
        target_modules=TARGETS, exclude_modules=EXCLUDE, modules_to_save=MODULES_TO_SAVE,
        layers_to_transform=LAYERS, layers_pattern=LAYERS_PATTERN, init_weights=INIT,
    ),
    tensors=peanut_tensors, check=check_peanut,
)
