"""A tuner's settings read from its ``adapter_config.json`` (or the same keys in a scenario's ``peft:``
mapping), checked against the tuner's key table (``base.Key``) into a ``PeftSpec``.

``PeftConfig.from_pretrained`` (peft 0.21.2 ``config.py``) drops keys its class does not know with a
warning; memfit does the same and says so in the plan's notes. The keys ``PeftConfig`` itself holds
(``base_model_name_or_path``, ``revision``, ``inference_mode``, ``auto_mapping``, ``peft_version``)
size nothing: memfit plans training (``is_trainable=True``) whatever ``inference_mode`` says.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from memfit.core.peft.spec import PeftSpec
from memfit.core.peft.targets import ALL_LINEAR
from memfit.core.peft.tuners.base import Key, Tuner
from memfit.core.reading import parse_bool
from memfit.errors import MemfitError

PEFT_CONFIG_KEYS = frozenset({"peft_type", "task_type", "base_model_name_or_path", "revision", "inference_mode",
                              "auto_mapping", "peft_version"})
"""``PeftConfig``'s own fields (``peft/config.py``)."""

_TARGET_FIELDS = ("target_modules", "exclude_modules", "layers_to_transform", "layers_pattern", "modules_to_save")

PROMPT_LEARNING_KEYS = frozenset({"num_virtual_tokens", "token_dim", "num_layers", "num_transformer_submodules",
                                  "num_attention_heads", "modules_to_save"})
"""``PromptLearningConfig``'s fields (``peft/config.py``): the sizes ``_prepare_prompt_learning_config``
fills in and peft saves; ``num_attention_heads`` sizes nothing."""


def _freeze(value: Any) -> Any:
    """JSON value -> hashable: lists become tuples, objects tuples of (key, value) pairs."""
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple((str(k), _freeze(v)) for k, v in value.items())  # in order: get_pattern_key takes the first
    return value


def _check_type(name: str, key: Key, value: Any, *, cli: bool) -> Any:
    if value is None:
        if key.nullable:
            return None
        raise MemfitError(f"{name} is null; peft takes that as given and fails on it: write a value or leave the key "
                          "out for peft's default")
    t = key.type
    if cli and isinstance(value, str):  # a flag or a YAML string
        if t == "bool":
            return parse_bool(value, what=name)
        if t in ("int", "int_or_list") and value.strip().lstrip("-").isdigit():
            return int(value)
        if t == "float":
            try:
                return float(value)
            except ValueError:
                pass
        if t in ("list", "str_or_list") and "," in value:
            return [v.strip() for v in value.split(",") if v.strip()]
    is_int = isinstance(value, int) and not isinstance(value, bool)
    ok = {
        "int": is_int,
        "float": (is_int or isinstance(value, float)) and not isinstance(value, bool) and math.isfinite(value),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
        "list": isinstance(value, (list, tuple)),
        "dict": isinstance(value, dict),
        "int_or_list": is_int or (isinstance(value, (list, tuple)) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value)),
        "str_or_list": isinstance(value, str) or (isinstance(value, (list, tuple)) and all(
            isinstance(v, str) and v for v in value)),
        "any": True,
    }[t]
    if not ok:
        raise MemfitError(f"{name} must be {_TYPE_TEXT[t]}, got {value!r}")
    if key.choices and value not in key.choices:
        raise MemfitError(f"{name} must be one of {', '.join(map(repr, key.choices))}, got {value!r}")
    return value


_TYPE_TEXT = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string", "list": "a list",
              "dict": "a mapping", "int_or_list": "an integer or a list of integers",
              "str_or_list": "a string or a list of names", "any": "a value"}


def _same(value: Any, default: Any) -> bool:
    """Equal as peft would treat them (an empty list or mapping is no value)."""
    empty = (None, [], {}, ())
    if value in empty and default in empty:
        return True
    return _freeze(value) == _freeze(default)


def read_tuner(tuner: Tuner, raw: Mapping[str, Any], *, cli: bool = False) -> PeftSpec:
    """``raw`` (adapter_config.json's keys, or options given in a scenario) as a ``PeftSpec``.

    ``cli``: the user's own options (flags, a scenario's ``peft:`` mapping): values may be strings to
    convert, ``None`` means not given, and an unknown key is an error; a JSON file's values are taken
    as typed and an unknown key is ignored as peft ignores it (said in the notes).
    """
    notes: list[str] = [tuner.note] if tuner.note else []
    settings: dict[str, Any] = {}
    fields: dict[str, Any] = {}
    for name, value in raw.items():
        if name in PEFT_CONFIG_KEYS:
            continue
        if cli and value is None and (name in tuner.keys or name in PROMPT_LEARNING_KEYS):
            continue
        if tuner.prompt_learning and name in PROMPT_LEARNING_KEYS:
            if name == "modules_to_save":
                fields[name] = _check_type(name, Key("list", None, "sized", nullable=True), value, cli=cli)
            elif name != "num_attention_heads" and value is not None:
                number = _check_type(name, Key("int", None, "sized"), value, cli=cli)
                if number <= 0:
                    raise MemfitError(f"{name} must be positive, got {number}")
                fields[name] = number
            continue
        key = tuner.keys.get(name)
        if key is None and cli:
            raise MemfitError(f"unknown {tuner.peft_type} option {name!r}; it takes "
                              f"{', '.join(sorted({*tuner.keys, *(PROMPT_LEARNING_KEYS if tuner.prompt_learning else ())}))}")
        if key is None:
            notes.append(f"{tuner.peft_type}: key {name!r} ignored (peft 0.21.2's {tuner.peft_type} config has no such "
                         "field; PeftConfig.from_pretrained drops it with a warning)")
            continue
        value = _check_type(name, key, value, cli=cli)
        if key.role == "default" and not _same(value, key.default):
            raise MemfitError(f"{tuner.peft_type} setting {name}={value!r} is not modelled by memfit ({key.why})")
        if key.role == "note" and not _same(value, key.default):
            notes.append(f"{tuner.peft_type} {name}={value!r}: {key.why}")
        if name in _TARGET_FIELDS:
            fields[name] = value
        elif key.role in ("sized", "note"):
            settings[name] = _freeze(value)
    spec_fields: dict[str, Any] = {}
    targets = fields.get("target_modules")
    if isinstance(targets, str):
        spec_fields["target_modules_pattern"] = ALL_LINEAR if targets.lower() == ALL_LINEAR else targets
    elif targets is not None:
        if not targets:
            raise MemfitError("target_modules is an empty list: peft finds no module to adapt "
                              "(get_peft_model raises)")
        spec_fields["target_modules"] = tuple(targets)
    exclude = fields.get("exclude_modules")
    if isinstance(exclude, str):
        spec_fields["exclude_pattern"] = exclude
    elif exclude:
        spec_fields["exclude_modules"] = tuple(exclude)
    layers = fields.get("layers_to_transform")
    if layers is not None:
        spec_fields["layers_to_transform"] = (layers,) if isinstance(layers, int) else tuple(layers)
    pattern = fields.get("layers_pattern")
    if pattern:
        spec_fields["layers_pattern"] = (pattern,) if isinstance(pattern, str) else tuple(pattern)
    saved = fields.get("modules_to_save")
    if saved:
        spec_fields["modules_to_save"] = tuple(saved)
    for name in ("num_virtual_tokens", "token_dim", "num_layers", "num_transformer_submodules"):
        if name in fields:
            spec_fields[name] = fields[name]
    if tuner.method == "cpt":  # CPTConfig.__post_init__: num_virtual_tokens = len(cpt_token_ids)
        spec_fields["num_virtual_tokens"] = len(settings.get("cpt_token_ids") or (0,))
    task = raw.get("task_type")
    task = getattr(task, "value", task)
    if task is not None and not isinstance(task, str):
        raise MemfitError(f"task_type must be a string, got {task!r}")
    return PeftSpec(method=tuner.method, task_type=task, settings=tuple(sorted(settings.items())), notes=tuple(notes),
                    **spec_fields)


def _thaw(value: Any, key: Key) -> Any:
    if key.type == "dict" and isinstance(value, tuple):
        return {k: _thaw_plain(v) for k, v in value}
    return _thaw_plain(value)


def _thaw_plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_thaw_plain(v) for v in value]
    return value


def tuner_config(tuner: Tuner, spec: PeftSpec) -> dict[str, Any]:
    """The adapter_config.json keys ``spec`` stands for (the inverse of ``read_tuner``): what the real
    peft config is built from (``memfit.exact.peft_build``)."""
    out: dict[str, Any] = {k: _thaw(v, tuner.keys[k]) for k, v in spec.settings}
    if "target_modules" in tuner.keys:
        if spec.target_modules_pattern is not None:
            out["target_modules"] = spec.target_modules_pattern
        elif spec.target_modules:
            out["target_modules"] = list(spec.target_modules)
    if "exclude_modules" in tuner.keys:
        if spec.exclude_pattern is not None:
            out["exclude_modules"] = spec.exclude_pattern
        elif spec.exclude_modules:
            out["exclude_modules"] = list(spec.exclude_modules)
    if spec.layers_to_transform and "layers_to_transform" in tuner.keys:
        out["layers_to_transform"] = list(spec.layers_to_transform)
    if spec.layers_pattern and "layers_pattern" in tuner.keys:
        out["layers_pattern"] = list(spec.layers_pattern)
    if spec.modules_to_save and "modules_to_save" in tuner.keys:
        out["modules_to_save"] = list(spec.modules_to_save)
    return out
