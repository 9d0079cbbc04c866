"""Uni-LoRA: every LoRA factor entry of every adapted layer is one entry of a single trained vector
``theta_d`` (indexed by fixed int64 indices, scaled by ``1 / sqrt(count)``), held by the model (peft 0.21.2
``tuners/unilora/``: ``UniLoraModel._init_unilora_theta_d``, ``_assign_unilora_indices_and_scales``;
``UniLoraLayer.__init__``, ``reset_unilora_parameters``, ``update_scaling``)."""

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


def _check(layer: Layer, s: Settings) -> None:
    """``UniLoraConfig.__post_init__``'s refusals of the sizes."""
    require(s["r"] > 0, f"`r` should be a positive integer, got {s['r']}.")
    require(s["theta_d_length"] > 0, f"`theta_d_length` should be a positive integer, got {s['theta_d_length']}.")
    p = s["unilora_dropout"]
    require(0.0 <= p <= 1.0, f"`unilora_dropout` should be between 0.0 and 1.0, got {p}.")


def unilora_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """The model-level ``unilora_theta_d`` ``(theta_d_length,)`` (``nn.Parameter(torch.empty(...))``) is an
    attribute of every layer (``update_layer``: ``self.unilora_theta_d = unilora_theta_d``), so
    ``named_parameters()`` names it under the first target; per layer the buffers (``BufferDict``s of
    ``UniLoraLayer.__init__``, persistent iff ``save_indices``) ``unilora_indices_A (r, in)`` and
    ``unilora_indices_B (out, r)`` int64 (``torch.randint(..., dtype=torch.long)``), ``unilora_scales_A (r, in)``
    and ``unilora_scales_B (out, r)`` (``inv_sqrt_counts[...]`` in the base weight's dtype, ``update_scaling``; fp32:
    ``cast_adapter_dtype`` upcasts a 16-bit ``BufferDict`` entry with the adapters)."""
    r, i, o = s["r"], layer.in_features, layer.out_features
    keep = bool(s["save_indices"])
    at = f".{ADAPTER_NAME}"
    out = [AdapterTensor("unilora_theta_d" + at, (s["theta_d_length"],))] if layer.module == layers[0].module else []
    return out + [
        AdapterTensor("unilora_indices_A" + at, (r, i), buffer="int64", persistent=keep),
        AdapterTensor("unilora_indices_B" + at, (o, r), buffer="int64", persistent=keep),
        AdapterTensor("unilora_scales_A" + at, (r, i), buffer="fp32", persistent=keep),
        AdapterTensor("unilora_scales_B" + at, (o, r), buffer="fp32", persistent=keep),
    ]


TUNER = Tuner(
    peft_type="UNILORA", method="unilora", prefix="unilora_", source="peft/tuners/unilora/model.py, layer.py",
    targets=defaults.LORA, bias=True,
    keys=keys(
        r=sized("int", 4, "rank of the factors rebuilt from theta_d (their indices and scales are buffers)"),
        proj_seed=free("int", 42, "seed of the index assignment"),
        theta_d_length=sized("int", 256, "length of the one trained vector"),
        target_modules=TARGETS,
        unilora_dropout=sized("float", 0.0, "dropout on the adapter's input: a mask and a copy per layer"),
        fan_in_fan_out=FAN_IN_FAN_OUT, bias=bias_key("unilora_"), modules_to_save=MODULES_TO_SAVE,
        init_theta_d_bound=free("float", 0.02, "bound of theta_d's uniform init"),
        init_weights=INIT,
        save_indices=sized("bool", False, "the indices and scales are persistent buffers (in the state dict)"),
        layers_to_transform=LAYERS, layers_pattern=LAYERS_PATTERN,
    ),
    tensors=unilora_tensors,
    check=_check,
)
