"""The one place that refuses impossible model configs, for every family alike.

transformers builds some of these without complaint and fails later (a view that cannot split the
key heads, an expert index out of range, NaN frequencies); memfit refuses them up front with one
line that names the field. Every family builder calls these checks on the numbers it read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from memfit.errors import MemfitError


def check_heads(heads: int, kv_heads: int) -> None:
    """Grouped-query attention repeats each key/value head ``heads / kv_heads`` times."""
    if kv_heads > heads:
        raise MemfitError(
            f"config.json: num_key_value_heads {kv_heads} is more than num_attention_heads {heads}"
        )
    if heads % kv_heads:
        raise MemfitError(
            f"config.json: num_attention_heads {heads} is not a multiple of num_key_value_heads "
            f"{kv_heads} (each key/value head serves a whole group of query heads)"
        )


def check_experts(experts: int, top_k: int, *, experts_key: str = "num_experts") -> None:
    """A token is routed to ``top_k`` distinct experts out of ``experts``."""
    if top_k > experts:
        raise MemfitError(
            f"config.json: num_experts_per_tok {top_k} is more than {experts_key} {experts}"
        )


def check_rope(rope: Mapping[str, Any], *, where: str = "rope_theta") -> None:
    """``rope_theta`` and a scaling ``factor`` must be finite and positive (NaN, inf or 0 give NaN
    or infinite frequencies)."""
    for key in ("rope_theta", "factor"):
        value = rope.get(key)
        if value is None:
            continue
        bad = isinstance(value, bool) or not isinstance(value, int | float)
        if bad or not math.isfinite(value) or value <= 0:
            name = where if key == "rope_theta" else f"rope scaling {key}"
            raise MemfitError(f"config.json: {name} must be a finite positive number, got {value!r}")
