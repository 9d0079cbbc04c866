"""One check for every input, whoever set it (flag, file, Python): ``check_inputs`` checks each
``ScenarioInputs`` field against the type it declares; counts and whole numbers with their ranges."""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any

from memfit.core.reading import parse_bool
from memfit.core.scenario.inputs import HARDWARE_KEYS, TRAIN_KEYS, ScenarioInputs
from memfit.errors import MemfitError


def count_value(value: Any, what: str) -> int:
    """A whole number >= 0 (None: 0)."""
    if value is None:
        return 0
    if isinstance(value, bool):
        raise MemfitError(f"{what} must be a whole number, got {value!r}")
    try:
        n = int(str(value))
    except ValueError:
        raise MemfitError(f"{what} must be a whole number, got {value!r}") from None
    if n < 0:
        raise MemfitError(f"{what} must be at least 0, got {n}")
    return n


def positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(str(value))
        except ValueError:
            raise MemfitError(f"{what} must be a whole number, got {value!r}") from None
    if value < 1:
        raise MemfitError(f"{what} must be at least 1, got {value}")
    return value


MAX_INT = 2**31 - 1
"""The largest count any input may be (sequence length, micro batch, nodes, accumulation): far
beyond any real run, and small enough that every size computed from it stays exact."""

_YAML_KEY = {**{k: f"hardware.{k}" for k in HARDWARE_KEYS}, **{k: f"train.{k}" for k in TRAIN_KEYS},
             "load_dtype": "load.dtype", "zero_init": "load.zero_init", "low_cpu_mem_usage": "load.low_cpu_mem_usage",
             "peft_method": "peft.method", "ds_version": "deepspeed_version", "deepspeed_inline": "deepspeed",
             **{f"{k}_version": f"stack.{k}" for k in ("transformers", "peft", "bitsandbytes", "accelerate", "trl")},
             "stack_files": "stack.files"}
_FLAG = {"peft_method": "--peft", "ds_version": "--deepspeed-version", "deepspeed_inline": "--deepspeed",
         "stack_files": "--stack"}


def input_label(name: str) -> str:
    """How the user names a ``ScenarioInputs`` field: its flag and its scenario-file key."""
    flag = _FLAG.get(name, "--" + name.replace("_", "-"))
    return f"{flag} (scenario key {_YAML_KEY.get(name, name)})"


def check_inputs(inputs: ScenarioInputs) -> ScenarioInputs:
    """Every field checked against its declared type, whoever set it (flag, file, Python): ``str``
    non-empty; ``bool`` a boolean or true/false/yes/no/on/off; ``int`` a whole number (digits in a
    string too) from 1 (0 for ``_MAY_BE_ZERO``) to ``MAX_INT``; mappings mappings. Returns the inputs with booleans and
    numbers normalised. A new ``ScenarioInputs`` field is checked by its annotation, with no code."""
    hints = typing.get_type_hints(ScenarioInputs)
    changes: dict[str, Any] = {}
    for f in fields(ScenarioInputs):
        value = getattr(inputs, f.name)
        if value is None:
            continue
        hint = hints[f.name]
        if typing.get_origin(hint) in (typing.Union, types.UnionType):  # X | None
            hint = next(t for t in typing.get_args(hint) if t is not type(None))
        kind = typing.get_origin(hint) or hint
        label = input_label(f.name)
        if kind is bool:
            changes[f.name] = parse_bool(value, what=label)
        elif kind is int:
            changes[f.name] = _whole(value, label, minimum=_MAY_BE_ZERO.get(f.name, 1))
        elif kind is str:
            if not isinstance(value, str):
                raise MemfitError(f"{label} must be a string, got {value!r:.80}")
            if not value.strip():
                raise MemfitError(f"{label} is empty: give a value, or leave it out for the default")
        elif kind in (dict, Mapping, types.MappingProxyType) and not isinstance(value, Mapping):
            raise MemfitError(f"{label} must be a mapping, got {value!r:.80}")
    return replace(inputs, **changes) if changes else inputs


_MAY_BE_ZERO = {"dataloader_workers": 0, "dataset_tokens": 0}
"""Counts for which 0 is a real value (no workers, no dataset in memory); every other int is >= 1."""


def _whole(value: Any, what: str, *, limit: int = MAX_INT, minimum: int = 1) -> int:
    if isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 19:
        value = int(value.strip())
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise MemfitError(f"{what} must be a whole number, got {value!r:.80}")
    if not minimum <= value <= limit:
        shown = f"{value}" if abs(value) < 10**30 else f"a number of about {int(value.bit_length() * 0.30103)} digits"
        raise MemfitError(f"{what} must be from {minimum} to {limit:,}, got {shown}")
    return value
