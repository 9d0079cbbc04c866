"""A model's parameters and buffers from its config.json alone: pure Python, no torch.

``build_model_shape`` dispatches on ``model_type`` to a family builder in
``memfit.core.families``; each reproduces the ``(name, shape)`` pairs of ``named_parameters()`` of
the transformers class for the task (tied weights listed once, as ``named_parameters`` does) and
the ``(name, shape, dtype)`` of its ``named_buffers()`` (dtype as transformers creates them), and
the test suite checks every catalog model against a meta-device build with the installed
transformers (``memfit.exact.meta_build``). It is on the ``memfit plan`` hot path: Llama-3-70B (723
params) builds in about a millisecond.

A ``model_type`` without a pure builder raises ``NoPureBuilder``; ``memfit.exact.meta_build.
shape_from_meta_build`` then reads the shapes from the real class (slower, needs torch).

Custom code (``auto_map`` in config.json): transformers builds a ``model_type`` it ships with its own
class unless ``trust_remote_code`` is set (``AutoModel*.from_pretrained``: local code wins when
remote code is not trusted), and memfit plans it the same way, saying so in a note.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memfit.core.families import TRANSFORMERS_MODEL_TYPES, NoPureBuilder, family_for
from memfit.core.model import ModelShape
from memfit.core.stack.releases import at_least
from memfit.errors import MemfitError

if TYPE_CHECKING:
    from memfit.core.catalog import ModelConfigSource

__all__ = ["NoPureBuilder", "build_model_shape", "modelled_architecture"]


def build_model_shape(
    source: ModelConfigSource, *, task: str | None = None, trust_remote_code: bool = False,
    transformers_line: str | None = None,
) -> ModelShape:
    """Every parameter and buffer of the model ``source`` describes, with its architecture numbers.

    ``task``: one of ``memfit.core.families.heads.TASKS`` (default: from ``architectures[0]``).
    ``transformers_line``: the release that builds it (``"4.48"``); None: transformers 5's layout.
    Before 5.0 a mixture-of-experts model's experts are separate ``nn.Linear`` modules
    (``families.moe.per_expert_params``); from 5.25 Falcon's config has ``num_key_value_heads`` and its
    attention is the shared one (``families.falcon.at_release``); everything else is built the same.
    """
    config = source.config
    remote = "auto_map" in config
    if remote and (trust_remote_code or source.model_type not in TRANSFORMERS_MODEL_TYPES):
        raise MemfitError(
            f"{source.name} uses custom modeling code (auto_map) and the pure path models only the classes "
            "transformers ships: the exact path builds it from a local directory with --trust-remote-code"
        )
    shape = family_for(config).build(source.name, config, task)
    if shape.arch.model_type == "falcon":  # what the release's FalconConfig and FalconAttention do
        from memfit.core.families.falcon import at_release

        shape = at_release(shape, transformers_line)
    if transformers_line is not None and not at_least(transformers_line, "5.0"):
        from dataclasses import replace

        from memfit.core.families.moe import PER_EXPERT_LAYOUT, per_expert_params

        if shape.arch.num_experts > 1 and source.model_type in PER_EXPERT_LAYOUT:
            shape = replace(shape, params=per_expert_params(source.model_type, shape.params), notes=(
                *shape.notes, f"transformers {transformers_line} builds each expert as its own module of three "
                "nn.Linear (the 5.x layout fuses them): parameters named and shaped as that release has them; the "
                "experts' activations are those of 5.x's grouped experts (an estimate for the per-expert loop)"))
    if remote:
        from dataclasses import replace

        note = (f"config.json names custom code (auto_map); transformers ships model_type {source.model_type!r}, "
                f"so without --trust-remote-code it builds {shape.architecture}, as memfit plans it")
        shape = replace(shape, notes=(*shape.notes, note))
    if shape.config is None:
        from dataclasses import replace

        shape = replace(shape, config=config)
    return shape


def modelled_architecture(source: ModelConfigSource, *, task: str | None = None) -> str:
    """The transformers class whose parameters ``build_model_shape`` lists for ``task``.

    That is the family's class for the task (``GPTJForCausalLM``, ``T5ForConditionalGeneration``,
    ``BertForSequenceClassification`` ...): the head of ``architectures[0]`` when memfit sizes it,
    else the family's usual one.
    """
    family = family_for(source.config)
    if task is None:
        from memfit.core.families.heads import resolve_task

        task, _ = resolve_task(source.model_type, family.classes, family.default_task, source.config, None)
    if task not in family.classes:
        raise MemfitError(f"transformers has no {task} class for model_type {source.model_type!r}")
    return family.classes[task]


if TYPE_CHECKING:  # re-exported for callers that catch it
    NoPureBuilder = NoPureBuilder
