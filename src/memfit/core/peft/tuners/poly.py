"""Polytropon (Poly): per adapted Linear an inventory of ``n_skills`` LoRA pairs per split and a router of
per-task logits that mixes them for every sample (peft 0.21.2 ``tuners/poly/``: ``PolyLayer.__init__``,
``update_layer``; ``router.py:PolyRouter.__init__``; ``PolyModel._create_new_module``: ``nn.Linear`` only)."""

from __future__ import annotations

from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners import defaults
from memfit.core.peft.tuners.base import EXCLUDE, INIT, MODULES_TO_SAVE, TARGETS, Settings, Tuner, keys, require, sized


def _check(layer: Layer, s: Settings) -> None:
    """``update_layer``'s refusal of ``r``; the sizes peft's forward cannot reshape (``A.reshape(bs, in, r)`` of the
    ``in // n_splits``-row factors) are refused here, where peft builds them and fails at the first step."""
    r, q, k, n = s["r"], s["n_splits"], s["n_skills"], s["n_tasks"]
    require(r > 0, f"`r` should be a positive integer value but the value passed is {r}")
    require(q > 0 and k > 0 and n > 0, f"n_splits, n_skills and n_tasks must be positive, got {q}, {k} and {n}")
    for width, side in ((layer.in_features, "in_features"), (layer.out_features, "out_features")):
        require(width % q == 0, f"{side} ({width}) of {layer.module!r} is not divisible by n_splits ({q}): peft's "
                "Poly forward cannot reshape its factors")


def poly_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """In registration order (``PolyLayer.__init__``: ``poly_router`` before the factors):
    ``poly_router.default.module_logits (n_tasks, n_splits * n_skills)``, ``poly_lora_A (n_splits, n_skills,
    in // n_splits, r)``, ``poly_lora_B (n_splits, n_skills, r, out // n_splits)``."""
    r, q, k, n = s["r"], s["n_splits"], s["n_skills"], s["n_tasks"]
    at = f".{ADAPTER_NAME}"
    return [AdapterTensor(f"poly_router{at}.module_logits", (n, q * k)),
            AdapterTensor("poly_lora_A" + at, (q, k, layer.in_features // q, r)),
            AdapterTensor("poly_lora_B" + at, (q, k, r, layer.out_features // q))]


TUNER = Tuner(
    peft_type="POLY", method="poly", prefix="poly_", source="peft/tuners/poly/layer.py:PolyLayer.update_layer",
    targets=defaults.LORA, kinds=frozenset({"linear"}),
    keys=keys(
        r=sized("int", 8, "rank of every skill's factors"),
        target_modules=TARGETS, exclude_modules=EXCLUDE, modules_to_save=MODULES_TO_SAVE, init_weights=INIT,
        poly_type=sized("str", "poly", "the router (peft has one)", choices=("poly",)),
        n_tasks=sized("int", 1, "rows of the router's logits"),
        n_skills=sized("int", 4, "LoRA pairs per split, mixed per sample"),
        n_splits=sized("int", 1, "splits of the input and output widths"),
    ),
    tensors=poly_tensors,
    check=_check,
)
