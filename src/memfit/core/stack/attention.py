"""The attention implementation transformers builds when the script does not choose one, per release.

Read from the released wheels (``scripts/scan_sdpa_support.py`` writes ``sdpa_releases.py``):

- before 4.36 there is no ``attn_implementation``: every model runs the attention its modeling file
  writes, the "eager" matmul-softmax-matmul, except Falcon (4.33-4.35 ``FalconAttention.forward``:
  ``if alibi is None: if hasattr(F, "scaled_dot_product_attention") and not output_attentions:
  ... F.scaled_dot_product_attention(...)``, i.e. sdpa from torch 2.0, the first release with it);
- 4.36-4.55 (``modeling_utils.py:_autoset_attn_implementation`` -> ``_check_and_enable_sdpa``): sdpa
  when the class sets ``_supports_sdpa`` and ``is_torch_sdpa_available()`` (``torch >= 2.1.1``, "to
  avoid a numerical issue in SDPA with non-contiguous inputs"), else eager; a requested sdpa the class
  or torch cannot give raises;
- 4.56 on: ``is_torch_sdpa_available`` is always true (transformers needs torch >= 2.2); 5.x
  ``get_correct_attn_implementation``: sdpa when ``_supports_sdpa``, else eager.

Which classes set ``_supports_sdpa`` changes by release (GPT-2 and GPT-NeoX from 4.42, BERT 4.41,
OPT 4.46, T5/mT5/umT5 and GPT-J only in 5.x, Gemma 2 no longer from 5.21): ``SDPA_CHANGES``.
"""

from __future__ import annotations

import re

from memfit.core.stack.lines import at_least, line_key
from memfit.core.stack.sdpa_releases import SDPA_CHANGES
from memfit.errors import MemfitError

DISPATCH_FROM = "4.36"
"""The first release with ``attn_implementation`` and an sdpa default."""
TORCH_SDPA_FROM = (2, 1, 1)
"""``is_torch_sdpa_available`` in 4.36-4.55: ``version.parse(_torch_version) >= version.parse("2.1.1")``."""
TORCH_CHECK_UNTIL = "4.56"
"""From 4.56 ``is_torch_sdpa_available`` returns True for any torch transformers installs with."""
OWN_SDPA = {"falcon": "4.33"}
"""Modeling files that called ``F.scaled_dot_product_attention`` themselves before the dispatch (from the
release given to ``DISPATCH_FROM``; torch >= 2.0, the first release with the function)."""


def stack_torch_version(stack) -> str:  # noqa: ANN001 (memfit.core.stack.types.Stack)
    """The stack's torch as given (``2.1.0+cu118``), else its release line (``2.1``)."""
    entry = stack.entry("torch")
    return entry.version or entry.line or ""


def class_supports_sdpa(model_type: str, line: str) -> bool | None:
    """Whether transformers ``line``'s modeling file sets ``_supports_sdpa = True`` for the type; None:
    not read (a type outside memfit's pure families, or a line before the first read)."""
    changes = SDPA_CHANGES.get(model_type)
    if not changes or line_key(line) < line_key(changes[0][0]):
        return None
    state = False
    for at, ok in changes:
        if line_key(line) >= line_key(at):
            state = ok
    return state


def _torch_tuple(torch: str) -> tuple[int, ...]:
    """``2.1.1+cu118`` -> (2, 1, 1); each part's leading digits (``2.1.1rc1`` -> (2, 1, 1)); a line is its .0."""
    out = []
    for part in torch.split("+")[0].split("."):
        m = re.match(r"\d+", part)
        if m is None:
            break
        out.append(int(m.group(0)))
    return tuple(out + [0] * (3 - len(out)))


def default_attention(model_type: str, transformers_line: str | None, torch: str) -> tuple[str | None, str]:
    """``(implementation, why)`` when the script passes no ``attn_implementation``; implementation
    None: the release's choice for this type was not read (the caller keeps its own default).
    ``torch``: the stack's torch version as given (``2.1.0+cu118``) or its line (``2.1``, read as 2.1.0)."""
    if transformers_line is None:
        return None, "transformers not in the stack"
    tv = _torch_tuple(torch) if torch else (99, 0, 0)
    own = OWN_SDPA.get(model_type)
    if not at_least(transformers_line, DISPATCH_FROM):
        if own and at_least(transformers_line, own) and tv >= (2, 0, 0):
            return "sdpa", (f"transformers {transformers_line}'s {model_type} calls F.scaled_dot_product_attention "
                            f"itself (before the attn_implementation dispatch of {DISPATCH_FROM}; torch {torch})")
        return "eager", (f"transformers {transformers_line} has no attn_implementation (from {DISPATCH_FROM}): "
                         f"{model_type} runs its own matmul-softmax attention")
    supported = class_supports_sdpa(model_type, transformers_line)
    if supported is None:
        return None, f"transformers {transformers_line}'s {model_type} classes not read"
    if not supported:
        return "eager", f"transformers {transformers_line}'s {model_type} classes do not set _supports_sdpa"
    if not at_least(transformers_line, TORCH_CHECK_UNTIL) and tv < TORCH_SDPA_FROM:
        return "eager", (f"transformers {transformers_line} uses sdpa only with torch >= 2.1.1 "
                         f"(is_torch_sdpa_available); torch {torch}")
    return "sdpa", f"transformers {transformers_line}'s default for {model_type} (_supports_sdpa)"


def requested_sdpa(model_type: str, transformers_line: str | None, torch: str) -> bool:
    """A requested sdpa as transformers ``transformers_line`` takes it: True where the release gives
    it, one ``MemfitError`` line where the release refuses it (as ``from_pretrained`` raises), False
    where the release's classes were not read (the caller checks the current classes)."""
    if transformers_line is None:
        return False
    if not at_least(transformers_line, DISPATCH_FROM):
        if model_type in OWN_SDPA:
            return False
        raise MemfitError(f"attention sdpa: transformers {transformers_line} has no attn_implementation (added in "
                          f"{DISPATCH_FROM}); its {model_type} runs its own attention (eager): leave attention unset "
                          "or say eager")
    supported = class_supports_sdpa(model_type, transformers_line)
    if supported is None:
        return False
    if not supported:
        raise MemfitError(f"transformers {transformers_line}'s {model_type} classes do not support "
                          "attn_implementation='sdpa' (_supports_sdpa is not set; from_pretrained raises): leave "
                          "attention unset or say eager")
    if not at_least(transformers_line, TORCH_CHECK_UNTIL) and torch and _torch_tuple(torch) < TORCH_SDPA_FROM:
        raise MemfitError(f"attention sdpa: transformers {transformers_line} needs torch >= 2.1.1 for sdpa "
                          f"(is_torch_sdpa_available; from_pretrained raises ImportError), the stack's torch is {torch}")
    return True
