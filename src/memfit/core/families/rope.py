"""Rotary-embedding buffers (``inv_freq``/``original_inv_freq``) as transformers 5 registers them.

Each ``<Family>RotaryEmbedding`` (one per model) computes ``inv_freq`` with its own
``compute_default_rope_parameters`` for ``rope_type: default`` or with
``transformers/modeling_rope_utils.py:ROPE_INIT_FUNCTIONS[rope_type]`` otherwise, and registers it
twice (``inv_freq`` and ``original_inv_freq``), non-persistent fp32 vectors of ``ceil(r / 2)``
frequencies (``arange(0, r, 2, dtype=torch.float)``):

- default: ``r = head_dim`` for most families (Llama's ``compute_default_rope_parameters`` ignores
  ``partial_rotary_factor``); ``r = int(head_dim x partial_rotary_factor)`` for the families whose
  own default honours it (GPT-NeoX, Phi-3: ``default_partial=True``);
- ``linear``, ``dynamic``, ``yarn``, ``longrope``, ``llama3``: ``r = int(head_dim x partial_rotary_factor)``;
- ``proportional``: the rotated angles then zeros up to ``head_dim // 2``.

The rope dict is ``rope_scaling`` (transformers 4 configs) or ``rope_parameters`` (transformers 5);
its own ``partial_rotary_factor`` wins over a top-level one; the type is ``rope_type`` or the
legacy ``type``. ``rope_theta`` (top level or in the dict) is checked finite and positive.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memfit.core.families.validate import check_rope
from memfit.core.model import BufferSpec
from memfit.errors import MemfitError

SCALED_ROPE_TYPES = ("linear", "dynamic", "yarn", "longrope", "llama3")
"""``ROPE_INIT_FUNCTIONS`` entries whose frequency count is ``ceil(int(head_dim x factor) / 2)``."""


def rope_dict(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The rope parameters dict (empty if the config has none); ``MemfitError`` if not an object."""
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if not isinstance(rope, Mapping):
        raise MemfitError(f"config.json field 'rope_scaling' must be an object, got {rope!r}")
    return rope


def _factor(rope: Mapping[str, Any], config: Mapping[str, Any], default: float) -> float:
    factor = rope.get("partial_rotary_factor", config.get("partial_rotary_factor"))
    factor = default if factor is None else factor
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor <= 1:
        raise MemfitError(
            f"config.json partial_rotary_factor must be in (0, 1], got {factor!r}"
        )
    return float(factor)


def rope_frequencies(
    config: Mapping[str, Any],
    head_dim: int,
    *,
    rope: Mapping[str, Any] | None = None,
    default_partial: bool = False,
    partial_default: float = 1.0,
) -> int:
    """Length of ``inv_freq`` for one rope dict (``rope_dict(config)`` unless given)."""
    rope = rope_dict(config) if rope is None else rope
    check_rope(rope)
    check_rope({"rope_theta": config.get("rope_theta")})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    factor = _factor(rope, config, partial_default)
    if rope_type == "default":
        dim = int(head_dim * factor) if default_partial else head_dim
        return (dim + 1) // 2
    if rope_type in SCALED_ROPE_TYPES:
        return (int(head_dim * factor) + 1) // 2
    if rope_type == "proportional":  # rotated angles, then zeros up to head_dim // 2
        return max(int(factor * head_dim // 2), head_dim // 2)
    known = ", ".join(("default", *SCALED_ROPE_TYPES, "proportional"))
    raise MemfitError(f"config.json rope_type {rope_type!r} is not one of {known}")


def rotary_buffers(prefix: str, frequencies: int, *, tag: str = "") -> tuple[BufferSpec, ...]:
    """``{prefix}.{tag}inv_freq`` and ``{prefix}.{tag}original_inv_freq`` (fp32, not saved)."""
    return tuple(
        BufferSpec(f"{prefix}.{tag}{name}", (frequencies,), "fp32", persistent=False)
        for name in ("inv_freq", "original_inv_freq")
    )
