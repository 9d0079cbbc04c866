"""Turn CLI options or a PEFT ``adapter_config.json`` into a validated ``PeftSpec``.

The only place memfit reads PEFT settings from outside: both entry points raise ``MemfitError`` with
one clear line for bad input, and the core sees typed ``PeftSpec``s only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from memfit.core.reading import parse_bool, parse_json, read_text
from memfit.core.peft.lora import ALL_LINEAR
from memfit.core.peft.lora_keys import LORA_KEYS
from memfit.core.peft.params import validate_peft_spec
from memfit.core.peft.spec import PeftSpec
from memfit.core.peft.tuners import BY_PEFT_TYPE, TUNERS
from memfit.core.peft.tuners.base import Tuner
from memfit.core.peft.tuners.read import PEFT_CONFIG_KEYS, read_tuner
from memfit.errors import MemfitError

_METHOD_OPTIONS: Mapping[str, frozenset[str]] = {
    "full": frozenset({"task_type"}),
    "freeze": frozenset({"freeze_patterns", "train_patterns"}),
    "lora": frozenset(
        {
            "lora_r",
            "lora_alpha",
            "target_modules",
            "target_modules_pattern",
            "lora_bias",
            "modules_to_save",
            "use_dora",
            "task_type",
            "lora_dropout",
            "exclude_modules",
            "exclude_pattern",
            "layers_to_transform",
            "layers_pattern",
            "rank_pattern",
            "alpha_pattern",
            "lora_fa",
            "notes",
        }
    ),
    "prompt": frozenset(
        {"num_virtual_tokens", "modules_to_save", "task_type", "token_dim", "num_transformer_submodules"}
    ),
    "prefix": frozenset(
        {
            "num_virtual_tokens",
            "prefix_projection",
            "encoder_hidden_size",
            "modules_to_save",
            "task_type",
            "token_dim",
            "num_layers",
        }
    ),
}
"""The options each method takes (``PeftSpec`` field names)."""

_ALIASES: Mapping[str, str] = {"r": "lora_r", "alpha": "lora_alpha", "bias": "lora_bias"}
"""Short option names accepted for ``PeftSpec`` fields (peft's own spelling)."""

_INT_FIELDS = frozenset(
    {
        "num_virtual_tokens",
        "encoder_hidden_size",
        "lora_r",
        "token_dim",
        "num_layers",
        "num_transformer_submodules",
    }
)
_BOOL_FIELDS = frozenset({"prefix_projection", "use_dora", "lora_fa"})
_LIST_FIELDS = frozenset({"target_modules", "modules_to_save", "freeze_patterns", "train_patterns", "exclude_modules",
                          "layers_pattern"})
_STR_FIELDS = frozenset({"lora_bias", "task_type", "target_modules_pattern", "exclude_pattern"})

_PEFT_TYPES: Mapping[str, str] = {"LORA": "lora", "PREFIX_TUNING": "prefix", "PROMPT_TUNING": "prompt"}
"""adapter_config.json ``peft_type`` -> memfit method (the other tuners: ``memfit.core.peft.tuners``)."""


def parse_peft_options(method: str, **options: Any) -> PeftSpec:
    """A ``PeftSpec`` from CLI-style options, validated.

    ``options`` are ``PeftSpec`` field names (or ``r``, ``alpha``, ``bias``); ``None`` means not
    given. Lists may be given as comma-separated strings. ``target_modules="all-linear"`` (or a
    single regular expression given as ``target_modules_pattern``) selects peft's string form. An
    option the method does not take raises ``MemfitError``.
    """
    if method in TUNERS:
        return validate_peft_spec(with_experts(TUNERS[method], read_tuner(TUNERS[method], options, cli=True), None))
    if method not in _METHOD_OPTIONS:
        raise MemfitError(f"unknown PEFT method {method!r}; choose one of {', '.join((*_METHOD_OPTIONS, *TUNERS))}")
    values: dict[str, Any] = {}
    known = {f.name for f in fields(PeftSpec)} - {"method"}
    for key, value in options.items():
        name = _ALIASES.get(key, key)
        if name not in known:  # refused even without a value: a YAML flow mapping {a: x,y} makes y a key
            raise MemfitError(f"unknown PEFT option {key!r}" + (
                " (a value-less key: in a YAML {...} mapping a comma starts a new key; write a list [a, b])"
                if value is None else ""))
        if value is None:
            continue
        if name not in _METHOD_OPTIONS[method]:
            raise MemfitError(f"option {key!r} does not apply to method {method!r}")
        values[name] = _coerce(name, value)
    targets = values.get("target_modules", ())
    if "target_modules" in values and not targets:
        raise MemfitError("target_modules is empty: peft finds no module to adapt (get_peft_model raises "
                          "NoMatchingPeftModuleError); leave it out for peft's default modules")
    if len(targets) == 1 and targets[0].lower() == ALL_LINEAR:
        values["target_modules"] = ()
        values["target_modules_pattern"] = ALL_LINEAR
    if "encoder_hidden_size" in values and not values.get("prefix_projection", False):
        raise MemfitError("encoder_hidden_size needs prefix_projection")
    return validate_peft_spec(PeftSpec(method=method, **values))


def _coerce(name: str, value: Any) -> Any:
    if name == "notes":
        return tuple(value)
    if name == "lora_dropout":
        if isinstance(value, str) and value.strip():
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise MemfitError(f"lora_dropout must be a number in [0, 1), got {value!r}")
        return float(value)
    if name == "layers_to_transform":
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
            value = [int(v) if v.lstrip("-").isdigit() else v for v in value]
        if isinstance(value, int) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, Sequence) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise MemfitError(f"layers_to_transform must be a layer index or a list of them, got {value!r}")
        return tuple(value)
    if name in ("rank_pattern", "alpha_pattern"):
        if isinstance(value, Mapping):
            value = list(value.items())
        pairs = tuple((str(k), v) for k, v in value)
        kind = int if name == "rank_pattern" else (int, float)
        if not all(isinstance(v, kind) and not isinstance(v, bool) for _, v in pairs):
            raise MemfitError(f"{name} must map module patterns to {'ranks' if name == 'rank_pattern' else 'numbers'}, "
                              f"got {value!r}")
        return pairs
    if name in _INT_FIELDS:
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise MemfitError(f"{name} must be an integer, got {value!r}")
        return value
    if name == "lora_alpha":  # peft only scales by alpha / r: any finite number (an int or a float)
        if isinstance(value, str) and value.strip():
            try:
                value = float(value) if not value.strip().lstrip("-").isdigit() else int(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise MemfitError(f"lora_alpha must be a finite number, got {value!r}")
        return value
    if name in _BOOL_FIELDS:
        return parse_bool(value, what=name)
    if name in _LIST_FIELDS:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",")] if value.strip() else []
        if not isinstance(value, Sequence) or not all(isinstance(v, str) and v for v in value):
            raise MemfitError(f"{name} must be a list of non-empty names, got {value!r}")
        return tuple(value)
    if name in _STR_FIELDS:
        if not isinstance(value, str):
            raise MemfitError(f"{name} must be a string, got {value!r}")
        return value
    raise AssertionError(f"no type for PeftSpec field {name}")  # a PeftSpec field this table misses


def load_adapter_config(path: str | Path) -> PeftSpec:
    """A ``PeftSpec`` from a PEFT ``adapter_config.json`` (or a directory holding one).

    Supports every ``peft_type`` of peft 0.21.2 that memfit plans (LORA, PREFIX_TUNING, PROMPT_TUNING
    and ``memfit.core.peft.tuners``). The values peft saved after
    preparing the config (``token_dim``, ``num_layers``, ``num_transformer_submodules``) are kept,
    so the adapter is rebuilt as trained. ``inference_mode`` is ignored: memfit sizes training
    (peft's ``from_pretrained(..., is_trainable=True)``).
    """
    file = Path(path)
    try:
        if file.is_dir():
            file = file / "adapter_config.json"
        exists = file.exists()
    except OSError as exc:
        raise MemfitError(f"cannot read adapter config {file}: {exc.strerror}") from None
    if not exists:
        raise MemfitError(f"no adapter config at {file}")
    raw = parse_json(read_text(file, what="adapter config"), what=str(file))
    if not isinstance(raw, dict):
        raise MemfitError(f"{file} must hold a JSON object, got {type(raw).__name__}")
    try:
        return adapter_config_spec(raw, folder=file.parent)
    except MemfitError as exc:
        raise MemfitError(f"{file}: {exc}") from None


_PEFT_REFUSES_NULL: Mapping[str, tuple[str, ...]] = {
    "lora": ("r", "lora_alpha", "bias"),
    "prefix": ("num_virtual_tokens",),
    "prompt": ("num_virtual_tokens",),
}
"""Keys whose JSON null peft 0.21.2 takes as given and then fails on in ``get_peft_model``
(``'<=' not supported between 'NoneType' and 'int'`` for r, ``unsupported operand`` for
lora_alpha and num_virtual_tokens, ``'NoneType' object has no attribute 'endswith'`` for bias):
memfit refuses them too, never swapping in a default (tests/exact/test_peft_refusals.py)."""

_PEFT_INTS: Mapping[str, tuple[str, ...]] = {
    "lora": ("r",),
    "prefix": ("num_virtual_tokens", "token_dim", "num_layers", "encoder_hidden_size"),
    "prompt": ("num_virtual_tokens", "token_dim", "num_transformer_submodules"),
}
"""Keys peft uses as tensor sizes: a JSON string or float there fails in ``torch.empty`` / ``nn.Linear``."""


def _as_peft_reads_it(raw: Mapping[str, Any], method: str) -> None:
    """Refuse what ``PeftConfig.from_pretrained`` + ``get_peft_model`` would refuse, with its reason."""
    for key in _PEFT_REFUSES_NULL[method]:
        if key in raw and raw[key] is None:
            raise MemfitError(f"{key} is null; peft takes that as given and fails on it (get_peft_model raises); "
                              "write a value or leave the key out for peft's default")
    for key in _PEFT_INTS[method]:
        value = raw.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise MemfitError(f"{key} must be a JSON integer, got {value!r}; peft uses it as a tensor size and fails on "
                              "anything else")
    alpha = raw.get("lora_alpha")
    if method == "lora" and alpha is not None and (isinstance(alpha, (bool, str)) or not isinstance(alpha, (int, float))):
        raise MemfitError(f"lora_alpha must be a number, got {alpha!r}; peft divides it by r and fails on anything else")
    targets = raw.get("target_modules")
    if method == "lora" and targets is not None and not isinstance(targets, str) and not (
            isinstance(targets, list) and all(isinstance(t, str) for t in targets)):
        raise MemfitError(f"target_modules must be a list of module names or one regular expression, got {targets!r}")
    if method == "lora" and targets == []:
        raise MemfitError("target_modules is an empty list: peft finds no module to adapt (get_peft_model raises "
                          "NoMatchingPeftModuleError)")


NOT_PLANNABLE: dict[str, str] = {
}
"""peft tuners memfit cannot plan from the config and the model's shapes, with why."""


def adapter_config_spec(raw: Mapping[str, Any], *, folder: Path | None = None) -> PeftSpec:
    """A ``PeftSpec`` from an adapter config's dict: ``adapter_config.json``'s content, or a live
    peft config as ``save_pretrained`` writes it (its sets as lists: ``memfit.check`` converts them).
    ``folder``: where that file is (the other adapters a tuner names by path, X-LoRA's experts, are read
    relative to it; ``None``: relative to the working directory)."""
    peft_type = raw.get("peft_type")
    peft_type = getattr(peft_type, "value", peft_type)  # a live config holds the PeftType enum
    if peft_type in BY_PEFT_TYPE:
        tuner = BY_PEFT_TYPE[peft_type]
        return validate_peft_spec(with_experts(tuner, read_tuner(tuner, raw), folder))
    if peft_type not in _PEFT_TYPES:
        why = f" ({peft_type}: {NOT_PLANNABLE[peft_type]})" if peft_type in NOT_PLANNABLE else ""
        raise MemfitError(f"peft_type {peft_type!r} is not supported; memfit models "
                          f"{', '.join(sorted((*_PEFT_TYPES, *BY_PEFT_TYPE)))}{why}")
    method = _PEFT_TYPES[peft_type]
    _as_peft_reads_it(raw, method)
    options = _lora_options(raw) if method == "lora" else _prompt_learning_options(raw, method)
    return parse_peft_options(method, **options)


MAX_EXPERTS = 256
"""The most adapters one config may name (each is one bounded read of an ``adapter_config.json``)."""


def with_experts(tuner: Tuner, spec: PeftSpec, folder: Path | None) -> PeftSpec:
    """``spec`` with the LoRA adapters its ``tuner.experts`` key names (X-LoRA's ``adapters``: name -> folder)
    read into ``PeftSpec.experts``, in order, and their folders resolved in the settings (what
    ``memfit.exact.peft_build`` hands to peft). A relative folder is read from ``folder`` (the
    adapter_config.json's own; the working directory when ``None``, as peft reads it). Each folder's
    ``adapter_config.json`` is read as ``load_adapter_config`` reads any (bounded, never executed); a hub id or a
    missing folder is refused in one line naming the key and the path: memfit reads local files only."""
    if not tuner.experts:
        return spec
    key = tuner.experts
    named = spec.setting(key) or ()
    if len(named) > MAX_EXPERTS:
        raise MemfitError(f"{tuner.peft_type} {key} names {len(named)} adapters; memfit reads at most {MAX_EXPERTS}")
    experts: list[PeftSpec] = []
    resolved: list[tuple[str, str]] = []
    for name, where in named:
        if not isinstance(where, str) or not where:
            raise MemfitError(f"{tuner.peft_type} {key}[{name!r}] must be the folder of a saved LoRA adapter, "
                              f"got {where!r}")
        path = Path(where)
        if not path.is_absolute() and folder is not None:
            path = folder / path
        try:
            found = path.is_dir() and (path / "adapter_config.json").is_file()
        except (OSError, ValueError):
            found = False
        if not found:
            raise MemfitError(f"{tuner.peft_type} {key}[{name!r}]: {where!r} is not a local folder holding an "
                              f"adapter_config.json (looked in {path}); memfit reads experts from local folders "
                              "only, never from the hub: download the adapter and name its folder")
        raw = parse_json(read_text(path / "adapter_config.json", what="adapter config"), what=str(path))
        if not isinstance(raw, dict) or raw.get("peft_type") != "LORA":
            got = raw.get("peft_type") if isinstance(raw, dict) else type(raw).__name__
            raise MemfitError(f"{tuner.peft_type} {key}[{name!r}]: {path / 'adapter_config.json'} is not a LoRA "
                              f"adapter (peft_type {got!r}); {tuner.peft_type}'s experts are LoRA adapters")
        try:
            experts.append(adapter_config_spec(raw))
        except MemfitError as exc:
            raise MemfitError(f"{tuner.peft_type} {key}[{name!r}] {path / 'adapter_config.json'}: {exc}") from None
        resolved.append((name, str(path.resolve())))
    settings = tuple((k, tuple(resolved) if k == key else v) for k, v in spec.settings)
    return replace(spec, settings=settings, experts=tuple(experts))


def _lora_options(raw: Mapping[str, Any]) -> dict[str, Any]:
    """LoraConfig's keys (``LORA_KEYS``) as ``PeftSpec`` options: keys memfit does not model are refused
    unless at peft's default, ``note`` keys away from their default and unknown keys are said in the notes."""
    notes: list[str] = []
    for key, value in raw.items():
        if key in PEFT_CONFIG_KEYS:
            continue
        entry = LORA_KEYS.get(key)
        if entry is None:
            notes.append(f"LORA: key {key!r} ignored (peft 0.21.2's LoraConfig has no such field; "
                         "PeftConfig.from_pretrained drops it with a warning)")
            continue
        at_default = value in (None, [], {}, False) and entry.default in (None, [], {}, False) or value == entry.default
        if entry.role == "default" and not at_default:
            raise MemfitError(f"LoRA setting {key}={value!r} is not modelled by memfit ({entry.why})")
        if entry.role == "note" and not at_default:
            notes.append(f"LORA {key}={value!r}: {entry.why}")
    targets = raw.get("target_modules")
    exclude = raw.get("exclude_modules")
    layers = raw.get("layers_to_transform")
    pattern = raw.get("layers_pattern")
    options: dict[str, Any] = {
        "lora_r": raw.get("r"),
        "lora_alpha": raw.get("lora_alpha"),
        "lora_bias": raw.get("bias"),
        "lora_dropout": raw.get("lora_dropout"),
        "modules_to_save": raw.get("modules_to_save") or None,
        "use_dora": raw.get("use_dora"),
        "task_type": raw.get("task_type"),
        "rank_pattern": raw.get("rank_pattern") or None,
        "alpha_pattern": raw.get("alpha_pattern") or None,
        "layers_to_transform": layers,
        "layers_pattern": ([pattern] if isinstance(pattern, str) else pattern) or None,
        "notes": notes or None,
    }
    if isinstance(targets, str):
        options["target_modules_pattern"] = ALL_LINEAR if targets.lower() == ALL_LINEAR else targets
    elif targets:
        options["target_modules"] = list(targets)
    if isinstance(exclude, str):
        options["exclude_pattern"] = exclude
    elif exclude:
        options["exclude_modules"] = list(exclude)
    return options


def _prompt_learning_options(raw: Mapping[str, Any], method: str) -> dict[str, Any]:
    options: dict[str, Any] = {
        "num_virtual_tokens": raw.get("num_virtual_tokens"),
        "modules_to_save": raw.get("modules_to_save") or None,
        "task_type": raw.get("task_type"),
        "token_dim": raw.get("token_dim"),
    }
    if method == "prefix":
        projection = bool(raw.get("prefix_projection", False))
        options["prefix_projection"] = projection
        options["num_layers"] = raw.get("num_layers")
        options["encoder_hidden_size"] = raw.get("encoder_hidden_size") if projection else None
    else:
        options["num_transformer_submodules"] = raw.get("num_transformer_submodules")
    return options
