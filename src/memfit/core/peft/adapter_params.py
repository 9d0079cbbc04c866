"""Which parameters PEFT created (by name), for the ledgers and the quantization of the base model."""

from __future__ import annotations

import re


def _markers() -> tuple[str, ...]:
    from memfit.core.peft.tuners import PREFIXES

    prefixes = set(PREFIXES)
    return ("lora_", "prompt_encoder", "prefix_encoder", "modules_to_save", *sorted(prefixes - {"lora_"}))


ADAPTER_MARKERS = _markers()
"""Name parts of PEFT-created parameters: LoRA's, the prompt encoders', the ``modules_to_save`` copies'
and every other tuner's ``prefix`` (``memfit.core.peft.tuners``: ``hada_``, ``ia3_``, ``oft_`` ...)."""


_ADAPTER = re.compile("|".join(map(re.escape, ADAPTER_MARKERS)))


def is_adapter_param(name: str) -> bool:
    """PEFT-created parameters (adapter tensors, prompt/prefix encoders, modules_to_save copies)."""
    return _ADAPTER.search(name) is not None
