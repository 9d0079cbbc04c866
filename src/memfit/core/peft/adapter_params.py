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


XLORA_ROOT = "base_model.lora_model."
"""X-LoRA's path to the base (``XLoraModel.lora_model``): a name part holding ``lora_`` that no PEFT-created
parameter is marked by (its experts are ``.lora_A.<i>.``, its classifier ``internal_xlora_classifier``)."""


def is_adapter_param(name: str) -> bool:
    """PEFT-created parameters (adapter tensors, prompt/prefix encoders, modules_to_save copies)."""
    return _ADAPTER.search(name.removeprefix(XLORA_ROOT)) is not None


BASE_DTYPE_MARKERS = ("internal_xlora_classifier",)
"""Name parts of PEFT-created parameters that peft builds in the base model's dtype and never upcasts: X-LoRA's
classifier (peft 0.21.2 ``tuners/xlora/classifier.py``: ``nn.Linear(...).to(next(model.parameters()).dtype)``;
``autocast_adapter_dtype`` upcasts only the LoRA experts, ``_cast_adapter_dtype`` of their adapter names)."""


def keeps_base_dtype(name: str) -> bool:
    """A PEFT-created parameter in the base model's dtype (``BASE_DTYPE_MARKERS``), not fp32."""
    return any(m in name for m in BASE_DTYPE_MARKERS)
