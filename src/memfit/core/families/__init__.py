"""Pure-Python parameter shapes, one module per transformers model family.

Each family mirrors one modeling file of the installed transformers (5.x) closely enough to list
exactly the ``(name, shape)`` pairs that ``model.named_parameters()`` yields for the class it names
(tied weights once) and the ``(name, shape, dtype)`` of every ``model.named_buffers()`` entry, and
is tested against a meta-device build of that class for every catalog model and against real CPU
builds of tiny configs (tests/exact/test_meta_build.py). ``FAMILIES`` maps ``model_type`` to its
builder.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from memfit.core.families import bert, bloom, gpt2, gptj, llama, opt, t5
from memfit.core.model import ModelShape
from memfit.errors import MemfitError


@dataclass(frozen=True, slots=True, kw_only=True)
class Family:
    """A supported ``model_type``: the transformers class memfit models and its shape builder."""

    model_type: str
    architecture: str
    """transformers class whose ``named_parameters()`` the builder reproduces."""
    build: Callable[[str, Mapping[str, Any]], ModelShape]
    """``build(name, config)``: the model's parameters and buffers from its parsed config.json."""


FAMILIES: Mapping[str, Family] = MappingProxyType(
    {
        family.model_type: family
        for family in (
            Family(model_type="gptj", architecture=gptj.ARCHITECTURE, build=gptj.build_gptj),
            Family(model_type="gpt2", architecture=gpt2.ARCHITECTURE, build=gpt2.build_gpt2),
            *(
                Family(model_type=model_type, architecture=name, build=llama.build_llama_like)
                for model_type, name in llama.ARCHITECTURES.items()
            ),
            Family(model_type="opt", architecture=opt.ARCHITECTURE, build=opt.build_opt),
            Family(model_type="bloom", architecture=bloom.ARCHITECTURE, build=bloom.build_bloom),
            Family(model_type="t5", architecture=t5.ARCHITECTURE, build=t5.build_t5),
            Family(model_type="bert", architecture=bert.ARCHITECTURE, build=bert.build_bert),
        )
    }
)

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(FAMILIES)


def family_for(config: Mapping[str, Any]) -> Family:
    """The family of a parsed config.json; ``MemfitError`` naming the supported ones otherwise."""
    model_type = config.get("model_type")
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise MemfitError(
            f"model_type {model_type!r} has no pure-Python shape builder; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)} (the exact path "
            "memfit.exact.meta_build can still build it with transformers)"
        )
    return family
