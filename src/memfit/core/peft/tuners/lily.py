"""Lily: LoRA-like adapters whose A is shared by ``stride_A`` consecutive layers and whose ``num_B`` B
heads (mixed per forward by a trained router) are shared by every layer of a target (peft 0.21.2
``tuners/lily/``: ``LilyLayer.update_layer``, ``LilyModel._post_injection_hook``)."""

from __future__ import annotations

from collections.abc import Sequence

from memfit.core.model import ModelShape
from memfit.core.peft.inject import AdapterTensor, inject
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.spec import PeftSpec
from memfit.core.peft.targets import ALL_LINEAR, Layer, find_targets
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
from memfit.errors import MemfitError


def _group(layer: Layer, spec: PeftSpec, model_type: str) -> tuple[str, int, int]:
    """``_post_injection_hook``'s group key: the target entry the module's name ends with (plain
    ``key.endswith(suffix)``; a string ``target_modules`` is one entry; ``all-linear`` becomes every Linear's
    full name, so each layer is a group of its own) and the base weight's shape."""
    pattern = spec.target_modules_pattern
    if pattern is not None and pattern.lower() == ALL_LINEAR:
        return layer.module, layer.out_features, layer.in_features
    names = spec.target_modules
    if not names and pattern is None:
        default = defaults.LORA.get(model_type)  # find_targets has refused a missing default already
        if isinstance(default, str):
            pattern = default
        else:
            names = tuple(default or ())
    if pattern is not None:
        return pattern, layer.out_features, layer.in_features
    matched = sorted({n for n in names if layer.module.endswith(n)})
    if len(matched) > 1:  # peft takes the last of a set's iteration order: it depends on the hash seed
        raise MemfitError(f"LILY: {layer.module!r} ends with several target_modules entries ({', '.join(matched)}); "
                          "peft's sharing group then depends on Python's set order: memfit does not model that")
    return matched[0], layer.out_features, layer.in_features


def lily_tensors(layer: Layer, s: Settings, layers: Sequence[Layer], spec: PeftSpec) -> list[AdapterTensor]:
    """``lily_A (r, in)``, ``lily_B (num_B * r, out)`` (``nn.Linear(self.out_features, num_B * r)``), ``lily_router
    (num_B, r)``, each an ``nn.Linear`` without bias, registered in that order. ``_post_injection_hook`` then puts
    the group's first ``lily_B`` in every layer of the group, and the first ``lily_A`` of each ``stride_A`` run
    (in ``named_modules()`` order) in the run's layers: ``named_parameters()`` names a shared one where it meets it
    first."""
    r, stride, num_b = s["r"], s["stride_A"], s["num_B"]
    require(r > 0, f"`r` should be a positive integer value but the value passed is {r}")
    key = _group(layer, spec, s.model_type)
    index = [t.module for t in layers if _group(t, spec, s.model_type) == key].index(layer.module)
    at = f".{ADAPTER_NAME}"
    group = f"{key[0]}:{key[1]}x{key[2]}"
    return [AdapterTensor(f"lily_A{at}.weight", (r, layer.in_features), shared=f"lily_A:{group}:{index // stride}"),
            AdapterTensor(f"lily_B{at}.weight", (num_b * r, layer.out_features), shared=f"lily_B:{group}"),
            AdapterTensor(f"lily_router{at}.weight", (num_b, r))]


def build_lily(shape: ModelShape, spec: PeftSpec, s: Settings) -> ModelShape:
    """``BaseTuner.inject_adapter`` with Lily's layers, then its sharing (``lily_tensors``)."""
    require(s["stride_A"] >= 1, "`stride_A` must be at least 1.")
    require(s["num_B"] >= 2, "`num_B` must be at least 2 for the router to be trained.")
    layers = find_targets(shape, spec, what="LILY", defaults=defaults.LORA, kinds=frozenset({"linear"}))
    return inject(shape, spec, layers, lambda layer: lily_tensors(layer, s, layers, spec), what="LILY")


TUNER = Tuner(
    peft_type="LILY", method="lily", prefix="lily_", source="peft/tuners/lily/layer.py:LilyLayer.update_layer, "
    "model.py:LilyModel._post_injection_hook",
    targets=defaults.LORA, kinds=frozenset({"linear"}),  # _create_new_module: nn.Linear only
    keys=keys(
        r=sized("int", 32, "rank of A, and of each of the num_B B heads"),
        stride_A=sized("int", 1, "consecutive layers of a target sharing one A"),
        num_B=sized("int", 2, "B heads shared by every layer of a target, mixed by the router"),
        scaling=free("float", 1.0, "scales the delta only"),
        target_modules=TARGETS, exclude_modules=EXCLUDE, modules_to_save=MODULES_TO_SAVE,
        layers_to_transform=LAYERS, layers_pattern=LAYERS_PATTERN, init_weights=INIT,
    ),
    build=build_lily,
)
