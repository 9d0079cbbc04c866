"""VB-LoRA: every layer's low-rank factors mixed from one shared, trained vector bank (peft 0.21
``tuners/vblora/``: ``VBLoRAModel._init_vblora_vector_bank``, ``VBLoRALayer.update_layer``)."""

from __future__ import annotations

from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners import defaults
from memfit.core.peft.tuners.base import (EXCLUDE, FAN_IN_FAN_OUT, LAYERS, LAYERS_PATTERN, MODULES_TO_SAVE, TARGETS,
                                          Settings, Tuner, bias_key, free, keys, only, require, sized)


def vblora_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """``vblora_logits_A (r, in / vl, nv)``, ``vblora_logits_B (out / vl, r, nv)`` and the shared
    ``vblora_vector_bank (nv, vl)`` (a trained ParameterDict of the model, met first in the first
    adapted layer)."""
    r, vl, nv, k = s["r"], s["vector_length"], s["num_vectors"], s["topk"]
    require(r > 0, f"`r` {r} should be a positive integer value")
    require(k > 0, f"`topk` {k} should be a positive integer value")
    require(layer.in_features % vl == 0, f"`in_features` {layer.in_features} must be divisible by `vector_length` {vl}")
    require(layer.out_features % vl == 0,
            f"`out_features` {layer.out_features} must be divisible by `vector_length` {vl}")
    at = f".{ADAPTER_NAME}"
    return [AdapterTensor("vblora_logits_A" + at, (r, layer.in_features // vl, nv)),
            AdapterTensor("vblora_logits_B" + at, (layer.out_features // vl, r, nv)),
            AdapterTensor("vblora_vector_bank" + at, (nv, vl), shared="vblora_vector_bank")]


TUNER = Tuner(
    peft_type="VBLORA", method="vblora", prefix="vblora_", source="peft/tuners/vblora/model.py, layer.py",
    targets=defaults.VBLORA, bias=True,
    keys=keys(
        r=sized("int", 4, "rank of the mixed factors"),
        num_vectors=sized("int", 256, "vectors in the bank"),
        vector_length=sized("int", 256, "length of a bank vector (divides in and out)"),
        topk=sized("int", 2, "bank vectors mixed per sub-vector"),
        target_modules=TARGETS, exclude_modules=EXCLUDE,
        save_only_topk_weights=only(False, "saving only the top-k logits (an inference format)"),
        vblora_dropout=sized("float", 0.0, "dropout on the adapter's input: a mask and a copy per layer"),
        fan_in_fan_out=FAN_IN_FAN_OUT, bias=bias_key("vblora_"), modules_to_save=MODULES_TO_SAVE,
        init_vector_bank_bound=free("float", 0.02, "init range of the bank"),
        init_logits_std=free("float", 0.1, "init spread of the logits"),
        layers_to_transform=LAYERS, layers_pattern=LAYERS_PATTERN,
    ),
    tensors=vblora_tensors,
)
