"""What a tuner module declares: its ``adapter_config.json`` keys (every field of peft's config class,
each with the role it plays in memory: ``memfit.core.peft.keys``), its default targets, the layer
kinds it adapts and the tensors it adds to each one (or, for a tuner that injects no layers, how it
builds the whole model).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import field
from types import MappingProxyType
from typing import Any

from memfit.core.lean_dataclass import dataclass
from memfit.core.model import ModelShape
from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.keys import (EXCLUDE, FAN_IN_FAN_OUT, INIT, LAYERS, LAYERS_PATTERN, MODULES_TO_SAVE,  # noqa: F401
                                   TARGETS, TYPES, Key, bias_key, free, keys, note, only, sized)
from memfit.core.peft.spec import PeftSpec
from memfit.core.peft.targets import Layer
from memfit.errors import MemfitError


class Settings:
    """A tuner's keys with peft's defaults filled in, read from ``PeftSpec.settings``."""

    __slots__ = ("_values", "tuner", "model_type")

    def __init__(self, tuner: "Tuner", spec: PeftSpec, model_type: str = "") -> None:
        self.tuner = tuner
        self.model_type = model_type
        """The base model's ``model_type`` (for defaults that depend on it)."""
        self._values = {k: key.default for k, key in tuner.keys.items()}
        self._values.update(dict(spec.settings))

    def __getitem__(self, key: str) -> Any:
        if key not in self._values:
            raise KeyError(f"{self.tuner.method} has no setting {key!r}")  # a tuner module bug
        return self._values[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self._values.get(key, default)


ShapeBuilder = Callable[[ModelShape, PeftSpec, Settings], ModelShape]


@dataclass(frozen=True, slots=True, kw_only=True)
class Tuner:
    """One peft tuner as memfit plans it."""

    peft_type: str
    """``PeftType`` value (``IA3``)."""
    method: str
    """memfit's method name (``ia3``): ``peft_type.lower()``."""
    prefix: str
    """``<Tuner>Model.prefix``: every parameter whose name holds it trains."""
    keys: Mapping[str, Key]
    """Every field of peft's config class beyond ``PeftConfig``'s own (and ``PromptLearningConfig``'s,
    for prompt learning), in declaration order."""
    source: str
    """The peft code mirrored (files and functions)."""
    targets: Mapping[str, tuple[str, ...] | str] = field(default_factory=lambda: MappingProxyType({}))
    """Default ``target_modules`` per ``model_type`` (peft's ``TRANSFORMERS_MODELS_TO_..._MAPPING``)."""
    kinds: frozenset[str] = frozenset({"linear", "conv1d"})
    """The layer kinds it adapts (``memfit.core.peft.targets.Layer.kind``)."""
    tensors: Callable[[Layer, Settings, Sequence[Layer]], Sequence[AdapterTensor]] | None = None
    """The tensors it adds to one layer, in registration order (layer-injecting tuners); the third
    argument is every target layer (for sizes shared by the whole model, such as VeRA's projections)."""
    check: Callable[[Layer, Settings], None] | None = None
    """peft's own refusals for one layer (a ``ValueError`` in ``update_layer``), as ``MemfitError``."""
    build: ShapeBuilder | None = None
    """A tuner that does not inject per-layer adapters (prompt learning, ...): the whole shape."""
    bias: bool = False
    """Its config has ``bias`` (``none``/``all``/``<prefix>only``)."""
    note: str = ""
    """Said in the plan's notes whenever the tuner is planned (what memfit assumes that no config decides)."""
    model_config: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """Base-model config values peft requires before it builds the tuner (X-LoRA: ``use_cache`` false, or
    ``XLoraModel.__init__`` raises), planned so and set by ``memfit.exact.peft_build`` before peft runs."""
    experts: str = ""
    """The config key naming other adapters by folder (X-LoRA's ``adapters``: name -> path), whose
    ``adapter_config.json`` files ``memfit.core.peft.parse`` reads into ``PeftSpec.experts``; "" for none."""
    prompt_learning: bool = False
    """A ``PromptLearningConfig``: its config also holds ``num_virtual_tokens``, ``token_dim``,
    ``num_layers``, ``num_transformer_submodules`` and ``num_attention_heads`` (read into ``PeftSpec``)."""

    def settings(self, spec: PeftSpec, model_type: str = "") -> Settings:
        return Settings(self, spec, model_type)


def require(cond: bool, message: str) -> None:
    """Raise ``MemfitError(message)`` unless ``cond`` (peft raises a ValueError there too)."""
    if not cond:
        raise MemfitError(message)

