"""Reading a JSON or YAML input file safely, typed values with one-line errors, and the settings one
file gives with their provenance (``Sourced``)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import field
from pathlib import Path
from typing import Any

from memfit.core.lean_dataclass import dataclass
from memfit.errors import MemfitError

MAX_COUNT = 2**31 - 1
"""The largest whole number an input file may give (as ``core/scenario/validate.MAX_INT``)."""


def read_mapping(path: str, what: str) -> dict[str, Any]:
    """A JSON or YAML file's top-level mapping, read through memfit's bounded reader
    (``memfit.core.reading``: size cap, UTF-8, depth/node limits, YAML alias budget and cycles, safe
    YAML: no tags, no code)."""
    from memfit.core.reading import parse_json, parse_yaml, read_text

    p = Path(path)
    text = read_text(p, what=what)
    raw = parse_json(text, what=str(p)) if p.suffix.lower() == ".json" else parse_yaml(text, what=str(p))
    if not isinstance(raw, dict):
        raise MemfitError(f"{p}: {what} must be a mapping of keys, got {type(raw).__name__}")
    return raw


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def as_bool(value: Any, where: str) -> bool:
    """A boolean as the libraries read one: YAML/JSON true/false, or the strings "true"/"false"
    (any case) that ``accelerate config`` and hand-written files use."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise MemfitError(f"{where}: invalid value {_shown(value)}; valid: true or false")


def as_int(value: Any, where: str, *, minimum: int = 1, maximum: int = MAX_COUNT) -> int:
    """A whole number from ``minimum`` to ``maximum``: an int, a float with no fraction, or digits in a
    string (at most 19 of them: a number that long is refused before it is converted)."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit() and len(value.strip()) <= 20:
        value = int(value.strip())
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise MemfitError(f"{where}: invalid value {_shown(value)}; valid: a whole number from {minimum} to {maximum:,}")
    if not minimum <= value <= maximum:
        shown = f"{value}" if abs(value) < 10**30 else f"a number of {len(str(abs(value)))} digits"
        raise MemfitError(f"{where}: invalid value {shown}; valid: a whole number from {minimum} to {maximum:,}")
    return value


def as_float(value: Any, where: str, *, minimum: float = 0.0, maximum: float = 1e30) -> float:
    """A finite number from ``minimum`` to ``maximum`` (a string of a number too, as argparse reads it)."""
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value) if abs(value) < 1e300 else math.inf
    elif isinstance(value, str) and len(value) <= 40:
        try:
            number = float(value)
        except ValueError:
            number = None
    if number is None or not math.isfinite(number) or not minimum <= number <= maximum:
        raise MemfitError(f"{where}: invalid value {_shown(value)}; valid: a finite number from {minimum:g} to {maximum:g}")
    return number


def as_choice(value: Any, where: str, valid: Iterable[str], *, fold=str.lower) -> str:
    """One of ``valid`` (compared after ``fold``: lower case by default); else "invalid" listing them."""
    options = list(valid)
    if isinstance(value, str):
        by_fold = {fold(v): v for v in options}
        if fold(value.strip()) in by_fold:
            return by_fold[fold(value.strip())]
    raise MemfitError(f"{where}: invalid value {_shown(value)}; valid: {', '.join(options)}")


def as_mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise MemfitError(f"{where}: invalid value {_shown(value)}; valid: a mapping of keys")
    return dict(value)


def as_names(value: Any, where: str) -> tuple[str, ...]:
    """A list of names (module names, patterns): a list of non-empty strings."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v.strip() for v in value):
        raise MemfitError(f"{where}: invalid value {_shown(value)}; valid: a list of names (strings)")
    return tuple(value)


DTYPE_NAMES = {"float32": "fp32", "fp32": "fp32", "float": "fp32", "float16": "fp16", "fp16": "fp16", "half": "fp16",
               "bfloat16": "bf16", "bf16": "bf16", "uint8": "uint8", "torch.float32": "fp32",
               "torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.uint8": "uint8"}


def dtype_name(value: Any, where: str, *, valid: Iterable[str] = ("float32", "float16", "bfloat16")) -> str:
    name = DTYPE_NAMES.get(value.strip().lower()) if isinstance(value, str) else None
    options = tuple(valid)
    if name is None or name not in {DTYPE_NAMES[v] for v in options}:
        raise MemfitError(f"{where}: invalid value {_shown(value)}; valid: {', '.join(options)}")
    return name


def check_keys(raw: Mapping[str, Any], known: Iterable[str], where: str, *, refuse: bool,
               warnings: list[str] | None = None, library: str = "") -> None:
    """Keys of ``raw`` the library does not know, each with the known key it most likely misspells.
    ``refuse``: the library refuses them (one error line); else it ignores them, and each is one
    warning line (appended to ``warnings``): the plan is made as if the key were absent."""
    from memfit.core.dsconfig.sections import did_you_mean

    names = set(known)
    unknown = sorted(k for k in raw if k not in names)
    if not unknown:
        return
    hints = [f"{k!r}" + (f" (did you mean {c!r}?)" if (c := did_you_mean(k, names)) else "") for k in unknown]
    if refuse:
        raise MemfitError(f"{where}: unknown key(s) {', '.join(hints)}; {library} refuses them")
    assert warnings is not None
    for hint in hints:
        warnings.append(f"{where}: unknown key {hint}, which {library} ignores: planned as if it were absent")


@dataclass
class Sourced:
    """The settings one input file gives: each with where it came from (``file: key``) and whether the
    file wrote it or its library's default fills it (``defaults``: a default never contradicts a value
    given anywhere else). ``notes`` say what was resolved or ignored (the plan's notes), ``warnings``
    what the library would ignore or memfit reads but does not model (printed, and findings)."""

    layer: str
    """Which input this is (``memfit.core.inputs.precedence.LAYERS``)."""
    values: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)
    defaults: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def set(self, name: str, value: Any, origin: str, *, default: bool = False) -> None:
        """The file's value of ``name`` (a later ``set`` of the same name in one file replaces it)."""
        self.values[name] = value
        self.origin[name] = origin
        if default:
            self.defaults.add(name)
        else:
            self.defaults.discard(name)
