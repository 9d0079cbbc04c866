"""Which ``attn_implementation`` each family's transformers classes accept, and what each keeps.

transformers 5 picks the implementation at build time (``PreTrainedModel.
_check_and_adjust_attn_implementation`` / ``get_correct_attn_implementation`` in modeling_utils.py):
none requested means ``sdpa`` when the class sets ``_supports_sdpa`` and ``eager`` otherwise; a
requested one the class does not support (``_supports_sdpa``, ``_supports_flash_attn``,
``_supports_flex_attn``) raises. memfit applies the same rule in the analytic and the exact paths
(tests/exact/test_families.py compares this table with the class attributes).

What each keeps for backward (per layer, ``memfit.core.activations.analytic``):

- ``eager``: the score matrix ``(b, heads, s_q, s_kv)`` softmax output (fp32 in most families) and,
  with attention dropout, its mask and output; q, k, v and the merged heads;
- ``sdpa``: on CUDA the flash kernel when there is no explicit mask (q, k, v, the output and an fp32
  logsumexp per head and query), the memory-efficient one with a mask (the same plus the mask);
- ``flash_attention_2``/``flash_attention_3``: q, k, v, the output and the logsumexp (sliding windows
  and causality are kernel arguments, no mask tensor);
- ``flex_attention``: q, k, v, the output, the logsumexp and the block mask (a few KiB).
"""

from __future__ import annotations

from memfit.errors import MemfitError

IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")

_NO_SDPA = frozenset({"gemma2", "bloom", "deberta-v2"})
"""Classes with ``_supports_sdpa = False`` (transformers 5.24)."""
_NO_FLASH = frozenset({"llama4_text", "bloom", "t5", "mt5", "umt5", "deberta-v2"})
"""Classes with ``_supports_flash_attn = False``."""
_NO_FLEX = frozenset({"gpt2", "falcon", "bloom", "deberta-v2"})
"""Classes with ``_supports_flex_attn = False``."""


def supported(model_type: str) -> tuple[str, ...]:
    """The implementations the family's classes accept."""
    out = ["eager"]
    if model_type not in _NO_SDPA:
        out.append("sdpa")
    if model_type not in _NO_FLASH:
        out += ["flash_attention_2", "flash_attention_3"]
    if model_type not in _NO_FLEX:
        out.append("flex_attention")
    return tuple(out)


def resolve(model_type: str, requested: str | None) -> str:
    """The implementation transformers builds: ``requested``, or its default; one-line error if the
    family does not support the requested one."""
    if requested is None:
        return "eager" if model_type in _NO_SDPA else "sdpa"
    if requested not in IMPLEMENTATIONS:
        raise MemfitError(f"attention must be one of {', '.join(IMPLEMENTATIONS)}, got {requested!r}")
    ok = supported(model_type)
    if requested not in ok:
        raise MemfitError(
            f"transformers' {model_type} classes do not support attn_implementation={requested!r} "
            f"(they support: {', '.join(ok)})"
        )
    return requested


def keeps_logsumexp(implementation: str) -> bool:
    """Fused kernels keep q, k, v, the output and a logsumexp instead of the score matrix."""
    return implementation != "eager"
