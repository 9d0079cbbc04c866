"""A peft config field as memfit reads it: its JSON type, peft's default and the role it plays in memory.

Roles: ``sized`` (changes what is allocated; memfit reads it), ``free`` (changes no tensor's size or
lifetime: a scale, a seed, an init distribution, a merge or inference flag; accepted whatever its
value, the reason in the table), ``note`` (accepted; away from its default the plan says what memfit
did with it), ``default`` (not modelled: any value but the default is refused in one line naming the
key). Every tuner's table (and LoRA's, ``lora_keys.py``) is checked against peft's config class by
``tests/exact/test_every_tuner.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from memfit.core.lean_dataclass import dataclass

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


def keys(**table: Key) -> Mapping[str, Key]:
    return MappingProxyType(dict(table))
