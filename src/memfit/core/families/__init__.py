"""Pure-Python parameter shapes, one module per transformers model family.

Each family mirrors one modeling file of the installed transformers (5.x) closely enough to list
exactly the ``(name, shape)`` pairs that ``model.named_parameters()`` yields for the class a task
names (tied weights once) and the ``(name, shape, dtype)`` of every ``model.named_buffers()`` entry,
and is tested against a meta-device build of that class for every catalog model, every task head
and tiny configs of each option (tests/exact/test_meta_build.py, tests/exact/test_families.py).
``FAMILIES`` maps ``model_type`` to its builder; ``TRANSFORMERS_MODEL_TYPES`` lists every
``model_type`` transformers ships (a model without a pure builder is planned through the exact
path, never through remote code).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from memfit.core.lean_dataclass import dataclass
from memfit.core.families import bert, bloom, deberta, falcon, gpt2, gpt_neox, gptj, llama, opt, t5
from memfit.core.families.heads import TASKS
from memfit.core.families.transformers_types import TRANSFORMERS_MODEL_TYPES
from memfit.core.model import ModelShape
from memfit.errors import MemfitError


@dataclass(frozen=True, slots=True, kw_only=True)
class Family:
    """A supported ``model_type``: the transformers classes memfit models and its shape builder."""

    model_type: str
    classes: Mapping[str, str]
    """task -> transformers class whose ``named_parameters()`` the builder reproduces."""
    default_task: str
    build: Callable[..., ModelShape]
    """``build(name, config, task=None)``: the model's parameters and buffers from its parsed config.json."""

    @property
    def architecture(self) -> str:
        """The class of the family's usual head (causal LM, seq2seq LM or masked LM)."""
        return self.classes[self.default_task]


def _families() -> dict[str, Family]:
    out: list[Family] = [
        Family(model_type="gptj", classes=gptj.TASK_CLASSES, default_task="causal-lm", build=gptj.build_gptj),
        Family(model_type="gpt2", classes=gpt2.TASK_CLASSES, default_task="causal-lm", build=gpt2.build_gpt2),
        *(
            Family(model_type=mt, classes=llama.TASK_CLASSES[mt], default_task="causal-lm",
                   build=llama.build_llama_like)
            for mt in llama.MODEL_TYPES
        ),
        Family(model_type="opt", classes=opt.TASK_CLASSES, default_task="causal-lm", build=opt.build_opt),
        Family(model_type="bloom", classes=bloom.TASK_CLASSES, default_task="causal-lm", build=bloom.build_bloom),
        Family(model_type="gpt_neox", classes=gpt_neox.TASK_CLASSES, default_task="causal-lm",
               build=gpt_neox.build_gpt_neox),
        Family(model_type="falcon", classes=falcon.TASK_CLASSES, default_task="causal-lm", build=falcon.build_falcon),
        *(
            Family(model_type=mt, classes=t5.TASK_CLASSES[mt], default_task="seq2seq-lm", build=t5.build_t5)
            for mt in t5.TASK_CLASSES
        ),
        *(
            Family(model_type=mt, classes=bert.TASK_CLASSES[mt], default_task="masked-lm", build=bert.build_bert)
            for mt in bert.TASK_CLASSES
        ),
        Family(model_type="deberta-v2", classes=deberta.TASK_CLASSES, default_task="masked-lm",
               build=deberta.build_deberta_v2),
    ]
    return {f.model_type: f for f in out}


FAMILIES: Mapping[str, Family] = MappingProxyType(_families())

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(FAMILIES)

__all__ = ["FAMILIES", "SUPPORTED_MODEL_TYPES", "TASKS", "TRANSFORMERS_MODEL_TYPES", "Family", "family_for"]


def family_for(config: Mapping[str, Any]) -> Family:
    """The family of a parsed config.json; ``MemfitError`` naming the route otherwise."""
    model_type = config.get("model_type")
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise NoPureBuilder(str(model_type))
    return family


class NoPureBuilder(MemfitError):
    """A ``model_type`` memfit has no pure-Python builder for (the exact path may still plan it)."""

    def __init__(self, model_type: str) -> None:
        self.model_type = model_type
        if model_type in TRANSFORMERS_MODEL_TYPES:
            how = ("transformers ships it, so memfit plans it from a meta-device build of its class "
                   "(needs torch and transformers)")
        else:
            how = "transformers does not ship it either (custom code needs --trust-remote-code and a local directory)"
        super().__init__(f"model_type {model_type!r} has no pure-Python shape builder; {how}")
