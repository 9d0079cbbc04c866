"""Scenario inputs from a YAML file and/or flags, resolved into a typed ``Scenario``.

The YAML file (see examples/*.yaml) has the same names as the flags::

    name: kogpt prefix tuning
    model: kakaobrain/kogpt          # catalog name, Hub id, directory or config.json
    peft: {method: prefix, num_virtual_tokens: 10, prefix_projection: true, encoder_hidden_size: 4096}
    deepspeed: deepspeed/seed.json   # relative to the YAML file
    deepspeed_version: "0.19"
    hardware: {gpus: 2xrtx3090, nodes: 1, cpu_ram: 64GB}
    load: {dtype: fp32, zero_init: false, low_cpu_mem_usage: true}
    train: {seq_len: 512, micro_batch: 1, gradient_checkpointing: false, model_parameters: trainable}

Flags override the file; anything left unset takes the documented default.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from memfit.errors import MemfitError

_TOP = {"name", "model", "peft", "deepspeed", "deepspeed_version", "hardware", "load", "train",
        "trust_remote_code", "accelerator"}
_HW = {"gpus", "nodes", "cpu_ram", "nvme"}
_LOAD = {"dtype", "zero_init", "low_cpu_mem_usage"}
_TRAIN = {"seq_len", "micro_batch", "gradient_checkpointing", "model_parameters", "attention"}


@dataclass(frozen=True, slots=True, kw_only=True)
class ScenarioInputs:
    """What the user said, before resolution. ``None`` means "not given"."""

    name: str | None = None
    model: str | None = None
    peft_method: str | None = None
    """``full``, ``prefix``, ``prompt``, ``lora``, ``freeze``, or a path to adapter_config.json."""
    peft_options: dict[str, Any] = field(default_factory=dict)
    deepspeed: str | None = None
    """Path to the DeepSpeed JSON."""
    deepspeed_inline: dict[str, Any] | None = None
    """A DeepSpeed config given inline in the YAML file."""
    ds_version: str | None = None
    gpus: str | None = None
    nodes: int | None = None
    cpu_ram: str | None = None
    nvme: str | None = None
    load_dtype: str | None = None
    zero_init: bool | None = None
    low_cpu_mem_usage: bool | None = None
    seq_len: int | None = None
    micro_batch: int | None = None
    gradient_checkpointing: bool | None = None
    model_parameters: str | None = None
    attention: str | None = None
    trust_remote_code: bool | None = None
    accelerator: str | None = None


def merge_inputs(base: ScenarioInputs, override: ScenarioInputs) -> ScenarioInputs:
    """``override``'s given values win; PEFT options merge key by key."""
    changes = {}
    for f in fields(ScenarioInputs):
        v = getattr(override, f.name)
        if f.name == "peft_options":
            if v:
                changes[f.name] = {**base.peft_options, **v}
        elif v is not None:
            changes[f.name] = v
    if override.deepspeed is not None:
        changes["deepspeed_inline"] = None
    return replace(base, **changes)


def _section(raw: Any, name: str, allowed: set[str], path: Path) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise MemfitError(f"{path}: '{name}' must be a mapping")
    unknown = set(raw) - allowed
    if unknown:
        raise MemfitError(f"{path}: unknown key(s) in '{name}': {', '.join(sorted(unknown))} "
                          f"(known: {', '.join(sorted(allowed))})")
    return raw


def read_scenario_file(path: str | Path) -> ScenarioInputs:
    """Parse a scenario YAML (or JSON) file into inputs; paths inside are relative to it."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise MemfitError(f"scenario file not found: {p}")
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise MemfitError(f"{p}: not valid YAML{where}: {getattr(e, 'problem', e)}") from None
    except UnicodeDecodeError:
        raise MemfitError(f"{p}: not a text file") from None
    if not isinstance(raw, dict):
        raise MemfitError(f"{p}: expected a mapping of scenario keys, got {type(raw).__name__}")
    unknown = set(raw) - _TOP
    if unknown:
        raise MemfitError(f"{p}: unknown key(s): {', '.join(sorted(unknown))} (known: {', '.join(sorted(_TOP))})")
    hw = _section(raw.get("hardware"), "hardware", _HW, p)
    load = _section(raw.get("load"), "load", _LOAD, p)
    train = _section(raw.get("train"), "train", _TRAIN, p)
    peft = raw.get("peft")
    method, options = None, {}
    if isinstance(peft, str):
        method = peft
    elif isinstance(peft, dict):
        options = dict(peft)
        method = options.pop("method", None)
        if "adapter_config" in options:
            method = str(p.parent / options.pop("adapter_config"))
    elif peft is not None:
        raise MemfitError(f"{p}: 'peft' must be a method name or a mapping")
    if method and method.endswith(".json") and not Path(method).is_absolute():
        method = str(p.parent / method)
    ds = raw.get("deepspeed")
    ds_path, ds_inline = None, None
    if isinstance(ds, str):
        ds_path = str(p.parent / ds) if not Path(ds).is_absolute() else ds
    elif isinstance(ds, dict):
        ds_inline = ds
    elif ds is not None:
        raise MemfitError(f"{p}: 'deepspeed' must be a path to a DeepSpeed JSON or an inline mapping")
    model = raw.get("model")
    if isinstance(model, str) and (model.startswith("./") or model.startswith("../")):
        model = str(p.parent / model)
    ver = raw.get("deepspeed_version")
    return ScenarioInputs(
        name=raw.get("name") or p.stem, model=model, peft_method=method, peft_options=options,
        deepspeed=ds_path, deepspeed_inline=ds_inline, ds_version=None if ver is None else str(ver),
        gpus=None if hw.get("gpus") is None else str(hw["gpus"]), nodes=hw.get("nodes"),
        cpu_ram=None if hw.get("cpu_ram") is None else str(hw["cpu_ram"]),
        nvme=None if hw.get("nvme") is None else str(hw["nvme"]),
        load_dtype=load.get("dtype"), zero_init=load.get("zero_init"), low_cpu_mem_usage=load.get("low_cpu_mem_usage"),
        seq_len=train.get("seq_len"), micro_batch=train.get("micro_batch"),
        gradient_checkpointing=train.get("gradient_checkpointing"), model_parameters=train.get("model_parameters"),
        attention=train.get("attention"), trust_remote_code=raw.get("trust_remote_code"),
        accelerator=raw.get("accelerator"),
    )


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(str(value))
        except ValueError:
            raise MemfitError(f"{what} must be a whole number, got {value!r}") from None
    if value < 1:
        raise MemfitError(f"{what} must be at least 1, got {value}")
    return value


def _bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    raise MemfitError(f"{what} must be true or false, got {value!r}")


def _read_ds_json(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise MemfitError(f"DeepSpeed config not found: {p}")
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise MemfitError(f"{p}: not valid JSON (line {e.lineno}, column {e.colno}): {e.msg}") from None
    except UnicodeDecodeError:
        raise MemfitError(f"{p}: not a text file") from None
    if not isinstance(raw, dict):
        raise MemfitError(f"{p}: a DeepSpeed config must be a JSON object")
    return raw
