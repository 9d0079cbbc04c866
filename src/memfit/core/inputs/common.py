"""Reading a JSON or YAML file safely, and settings with their provenance."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memfit.errors import MemfitError


def read_mapping(path: str, what: str) -> dict[str, Any]:
    """A JSON or YAML file's top-level mapping, read through memfit's bounded reader
    (``memfit.core.reading``: size cap, UTF-8, depth/node limits, YAML alias budget, safe YAML: no
    tags, no code)."""
    from memfit.core.reading import parse_json, parse_yaml, read_text

    p = Path(path)
    if not p.is_file():
        raise MemfitError(f"{what} not found: {p}")
    text = read_text(p, what=what)
    raw = parse_json(text, what=str(p)) if p.suffix.lower() == ".json" else parse_yaml(text, what=str(p))
    if not isinstance(raw, dict):
        raise MemfitError(f"{p}: {what} must be a mapping of keys, got {type(raw).__name__}")
    return raw


def as_bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise MemfitError(f"{where} must be true or false, got {value!r}")


def as_int(value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise MemfitError(f"{where} must be a whole number, got {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise MemfitError(f"{where} must be a whole number, got {value!r}") from None


DTYPE_NAMES = {"float32": "fp32", "fp32": "fp32", "float": "fp32", "float16": "fp16", "fp16": "fp16", "half": "fp16",
               "bfloat16": "bf16", "bf16": "bf16", "uint8": "uint8", "torch.float32": "fp32",
               "torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.uint8": "uint8"}


def dtype_name(value: Any, where: str) -> str:
    name = DTYPE_NAMES.get(str(value).lower())
    if name is None:
        raise MemfitError(f"{where}: unknown dtype {value!r} (float32, float16, bfloat16)")
    return name


@dataclass
class Sourced:
    """Settings read from files, each with where it came from (``file: key``)."""

    values: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    defaults: set[str] = field(default_factory=set)
    """Settings a file does not give, filled with its library's default (they yield to a value given
    anywhere else)."""

    def set(self, name: str, value: Any, origin: str) -> None:
        default = "default)" in origin
        if name in self.values and self.values[name] != value:
            if default:
                return  # a default yields to a value given elsewhere
            if name in self.defaults:
                self.defaults.discard(name)
                self.values[name] = value
                self.origin[name] = origin
                return
            raise MemfitError(f"{origin} = {value!r} contradicts {self.origin[name]} = {self.values[name]!r}")
        if name not in self.values and default:
            self.defaults.add(name)
        elif name in self.values and not default:
            self.defaults.discard(name)
            self.origin[name] = origin
        self.values[name] = value
        self.origin.setdefault(name, origin)

    def merge(self, other: "Sourced") -> None:
        for k, v in other.values.items():
            self.set(k, v, other.origin[k])
        self.notes += other.notes
