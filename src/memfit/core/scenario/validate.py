"""One check for every input, whoever set it (flag, file, Python): ``check_inputs`` checks each
``ScenarioInputs`` field against the type it declares; counts and whole numbers with their ranges."""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any

from memfit.core.reading import parse_bool
from memfit.core.scenario.inputs import HARDWARE_KEYS, RUNTIME_KEYS, TRAIN_KEYS, ScenarioInputs
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
             **{k: f"runtime.{k}" for k in RUNTIME_KEYS},
             "load_dtype": "load.dtype", "zero_init": "load.zero_init", "low_cpu_mem_usage": "load.low_cpu_mem_usage",
             "fsdp_loading": "load.fsdp_loading",
             "checkpoint_index": "load.checkpoint_index", "max_shard_size": "load.max_shard_size",
             "peft_method": "peft.method", "peft_options": "peft", "ds_version": "deepspeed_version",
             "deepspeed_inline": "deepspeed",
             **{f: f"eval.{k}" for f, k in (("eval_strategy", "strategy"), ("eval_batch", "batch"),
                                            ("eval_seq_len", "seq_len"), ("eval_generate", "generate"),
                                            ("max_new_tokens", "max_new_tokens"),
                                            ("generation_max_length", "generation_max_length"),
                                            ("num_beams", "num_beams"), ("eval_steps", "steps"))},
             **{f"{k}_version": f"stack.{k}" for k in ("peft", "bitsandbytes", "accelerate", "trl")},
             "stack_files": "stack.files"}
_FLAG = {"peft_method": "--peft", "ds_version": "--deepspeed-version", "deepspeed_inline": "--deepspeed",
         "stack_files": "--stack"}


def scenario_key(name: str) -> str:
    """The scenario-file key of a ``ScenarioInputs`` field."""
    return _YAML_KEY.get(name, name)


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
        label = inputs.origins.get(f.name) or input_label(f.name)
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
    for name, valid in _choices().items():
        value = getattr(inputs, name)
        if value is not None and value not in valid:
            raise MemfitError(f"{inputs.origins.get(name) or input_label(name)}: invalid value {value!r:.60}; valid: "
                              f"{', '.join(valid)}")
    return replace(inputs, **changes) if changes else inputs


def _choices() -> dict[str, tuple[str, ...]]:
    """The fields that take one of a fixed set of words, and the words (from the modules that model
    them); anything else is "invalid", listing them. ``precision`` takes the union (under DeepSpeed
    only fp16, bf16 and fp32: ``build_scenario`` says so). The stack's versions (``ds_version``,
    ``torch_version``, ``transformers_version``, ...) are releases, checked by ``memfit.core.stack``
    against the releases it models."""
    from memfit.core.batch_shapes import BATCHING_RULES
    from memfit.core.families.attention import IMPLEMENTATIONS
    from memfit.core.families.heads import TASKS
    from memfit.core.frameworks.pytorch import FRAMEWORKS, OPTIMIZERS, PRECISION_MODES
    from memfit.core.scenario.types import DTYPES, PIN_MEMORY_BACKENDS

    return {"precision": PRECISION_MODES, "framework": FRAMEWORKS, "optim": OPTIMIZERS, "load_dtype": DTYPES,
            "model_parameters": ("trainable", "all"), "attention": IMPLEMENTATIONS, "task": TASKS,
            "batching": BATCHING_RULES, "accelerator": ("cuda", "cpu"), "pin_memory_backend": PIN_MEMORY_BACKENDS,
            "eval_strategy": ("no", "steps", "epoch")}


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
