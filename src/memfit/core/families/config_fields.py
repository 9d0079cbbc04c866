"""Read the shape-relevant fields of a parsed config.json, with the transformers defaults.

transformers fills a missing field from its config class default (``GPT2Config.n_embd = 768`` ...)
and accepts aliases through ``attribute_map`` (``hidden_size`` for GPT-2's ``n_embd``). The family
builders read fields through these helpers so a missing key or an alias gives the same number the
real config class would, and a wrong type gives a one-line ``MemfitError`` instead of a traceback.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memfit.errors import MemfitError


def _lookup(config: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[str, Any] | None:
    """First of ``keys`` present in ``config`` (canonical name first, then its aliases)."""
    for key in keys:
        if key in config:
            return key, config[key]
    return None


MAX_LAYERS = 1024
"""The most layers memfit plans (every layer's parameters are ledger entries): the deepest real
decoders have under 200."""
MAX_DIMENSION = 2**26
"""The largest any other shape field may be (hidden sizes, vocabularies, heads, positions):
67,108,864, far above any real model (vocabularies reach ~256k, positions ~10M)."""
LAYER_KEYS = frozenset({"num_hidden_layers", "n_layer", "num_layers", "n_layers", "num_decoder_layers"})


def _limit(key: str) -> int:
    return MAX_LAYERS if key in LAYER_KEYS else MAX_DIMENSION


def read_int(
    config: Mapping[str, Any], *keys: str, default: int | None, minimum: int = 1
) -> int:
    """An integer field, ``default`` if absent or null; ``MemfitError`` unless an int from
    ``minimum`` to the field's limit (``MAX_LAYERS`` for layer counts, else ``MAX_DIMENSION``)."""
    found = _lookup(config, keys)
    key, value = found if found is not None else (keys[0], None)
    if value is None:
        if default is None:
            raise MemfitError(f"config.json has no {keys[0]!r}, which memfit needs")
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise MemfitError(f"config.json field {key!r} must be an integer, got {value!r}")
    if value < minimum:
        raise MemfitError(f"config.json field {key!r} must be at least {minimum}, got {value}")
    if value > _limit(key):
        raise MemfitError(f"config.json field {key!r} is {value if value < 10**30 else 'a huge number'}; memfit "
                          f"plans at most {_limit(key):,} (no real model comes near it)")
    return value


def read_optional_int(config: Mapping[str, Any], *keys: str) -> int | None:
    """An integer field that may be absent or null (e.g. ``n_inner``: null means 4 x hidden)."""
    found = _lookup(config, keys)
    if found is None or found[1] is None:
        return None
    return read_int(config, *keys, default=None)


def read_bool(config: Mapping[str, Any], key: str, *, default: bool) -> bool:
    """A boolean field; ``MemfitError`` if it is present and not a bool."""
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise MemfitError(f"config.json field {key!r} must be true or false, got {value!r}")
    return value


def read_str(config: Mapping[str, Any], key: str, *, default: str) -> str:
    """A string field; ``MemfitError`` if it is present and not a string."""
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise MemfitError(f"config.json field {key!r} must be a string, got {value!r}")
    return value


def divide_heads(hidden_size: int, num_heads: int, *, what: str = "hidden size") -> int:
    """``hidden_size // num_heads``, refusing sizes that transformers itself rejects."""
    if hidden_size % num_heads:
        raise MemfitError(
            f"{what} {hidden_size} is not divisible by the number of attention heads {num_heads}"
        )
    return hidden_size // num_heads


def read_float(config: Mapping[str, Any], key: str, *, default: float | None) -> float | None:
    """A number field, ``default`` if absent or null; ``MemfitError`` if not a finite number."""
    value = config.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MemfitError(f"config.json field {key!r} must be a number, got {value!r}")
    if value != value or value in (float("inf"), float("-inf")):
        raise MemfitError(f"config.json field {key!r} must be a finite number, got {value!r}")
    return float(value)


def read_int_list(config: Mapping[str, Any], key: str) -> tuple[int, ...]:
    """A list of integers (layer indices), empty if absent or null."""
    value = config.get(key)
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or any(
        isinstance(v, bool) or not isinstance(v, int) for v in value
    ):
        raise MemfitError(f"config.json field {key!r} must be a list of integers, got {value!r}")
    return tuple(value)
