"""What a tuner module declares: its ``adapter_config.json`` keys (every field of peft's config class,
each with the role it plays in memory), its default targets, the layer kinds it adapts and the
tensors it adds to each one.

Key roles:

- ``sized``: changes what is allocated; memfit reads it.
- ``free``: changes no tensor's size or lifetime (a scale, a seed, an init distribution, a flag for
  merging or inference); accepted whatever its value, with the reason in the table.
- ``note``: accepted; when not at its default the plan says what memfit did with it (e.g. an init
  that runs once at setup).
- ``default``: not modelled; any value but the default is refused in one line naming the key.

``tests/exact/test_peft_against_library.py`` checks that every tuner lists exactly the fields of
peft's config class and that every default equals peft's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from memfit.core.model import ModelShape
from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.spec import PeftSpec
from memfit.core.peft.targets import Layer
from memfit.errors import MemfitError

TYPES = ("int", "float", "number", "bool", "str", "list", "dict", "int_or_list", "str_or_list", "any")


@dataclass(frozen=True, slots=True)
class Key:
    """One config field of a peft tuner."""

    type: str
    """JSON type accepted: one of ``TYPES`` (``number``: int or float; ``*_or_list``: either)."""
    default: Any
    """peft 0.21.2's default (JSON form: lists for tuples, ``None`` for no value)."""
    role: str
    """``sized``, ``free``, ``note`` or ``default`` (module doc)."""
    why: str = ""
    """What the key does to memory (or why it does nothing), from the tuner's code."""
    nullable: bool = False
    """JSON null is accepted (peft's ``Optional`` field used as given)."""
    choices: tuple[Any, ...] = ()
    """The values peft accepts, when it checks them."""


def sized(type_: str, default: Any, why: str = "", *, nullable: bool = False, choices: tuple[Any, ...] = ()) -> Key:
    return Key(type_, default, "sized", why, nullable or default is None, choices)


def free(type_: str, default: Any, why: str, *, nullable: bool = False, choices: tuple[Any, ...] = ()) -> Key:
    return Key(type_, default, "free", why, nullable or default is None, choices)


def note(type_: str, default: Any, why: str, *, nullable: bool = False, choices: tuple[Any, ...] = ()) -> Key:
    return Key(type_, default, "note", why, nullable or default is None, choices)


def only(default: Any, why: str, type_: str = "any") -> Key:
    return Key(type_, default, "default", why, True)


# The target keys most tuners share; they land in PeftSpec's own fields.
TARGETS = sized("str_or_list", None, "the modules adapted (memfit.core.peft.targets)")
EXCLUDE = sized("str_or_list", None, "modules never adapted")
LAYERS = sized("int_or_list", None, "only layers with these indices are adapted")
LAYERS_PATTERN = sized("str_or_list", None, "the module list holding the layers, for layers_to_transform")
FAN_IN_FAN_OUT = free("bool", False, "transposes the delta for GPT-2's Conv1D; set by peft itself for Conv1D")
INIT = free("any", True, "how the new tensors are initialized (same shapes)")
MODULES_TO_SAVE = sized("list", None, "modules trained in full beside the adapter (a frozen original and a trained copy)")


def bias_key(prefix: str) -> Key:
    return sized("str", "none", f"none, all (every bias trains) or {prefix}only (the adapted layers' biases)",
                 choices=("none", "all", f"{prefix}only"))


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
    prompt_tokens: Callable[[Settings], int] | None = None
    """Virtual tokens it prepends to every sequence (prompt-style tuners), for activations."""

    def settings(self, spec: PeftSpec, model_type: str = "") -> Settings:
        return Settings(self, spec, model_type)


def require(cond: bool, message: str) -> None:
    """Raise ``MemfitError(message)`` unless ``cond`` (peft raises a ValueError there too)."""
    if not cond:
        raise MemfitError(message)


def keys(**table: Key) -> Mapping[str, Key]:
    return MappingProxyType(dict(table))
