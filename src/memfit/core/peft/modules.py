"""How peft names, wraps and classifies a model's modules: the adapter name, task types and the heads
each task adds to ``modules_to_save``, the ``ModulesToSaveWrapper`` renaming, and a layer's kind
(Linear, GPT-2's transposed Conv1D, Embedding) read from its name. Shared by every method's module
beside this one (``lora``, ``prompt_learning``) and by ``params.apply_peft``.

Glossary: a *module* is a dotted prefix of a parameter name (``transformer.h.0.attn.q_proj``); a
*layer* is a module that owns a 2-D ``weight`` (and maybe a ``bias``) and nothing else. A
``ModelShape`` carries no module classes, so a layer's kind is read from its name: see ``layer_kind``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from memfit.core.model import ModelShape, ParamSpec
from memfit.core.peft.spec import PeftSpec
from memfit.errors import MemfitError

ADAPTER_NAME = "default"
"""The adapter name ``get_peft_model`` uses; it appears in every adapter parameter's name."""

TASK_TYPES: tuple[str, ...] = (
    "CAUSAL_LM",
    "SEQ_2_SEQ_LM",
    "SEQ_CLS",
    "TOKEN_CLS",
    "QUESTION_ANS",
    "FEATURE_EXTRACTION",
)
"""peft ``TaskType`` values memfit models (each picks a ``PeftModelFor...`` class)."""

CONV1D_MODEL_TYPES: frozenset[str] = frozenset({"gpt2", "openai-gpt", "imagegpt", "decision_transformer"})
"""``model_type``s built with transformers' ``Conv1D`` (weight stored as ``(in, out)``)."""

CONV1D_LAYER_NAMES: frozenset[str] = frozenset({"c_attn", "c_proj", "c_fc", "q_attn"})
"""Layer names that are ``Conv1D`` in the ``CONV1D_MODEL_TYPES`` (their ``lm_head``/``score`` are
``nn.Linear``)."""

# fmt: off
EMBEDDING_LAYER_NAMES: frozenset[str] = frozenset({
    "wte", "wpe", "embed_tokens", "embed_positions", "word_embeddings", "position_embeddings",
    "token_type_embeddings", "shared", "embed_in", "relative_attention_bias", "tokens_embed",
    "positions_embed",
})
# fmt: on
"""Layer names that are ``nn.Embedding`` in transformers models (``weight`` is ``(rows, dim)``)."""

OUTPUT_HEAD_NAMES: tuple[str, ...] = ("lm_head", "embed_out", "cls.predictions.decoder")
"""What ``get_output_embeddings()`` returns in transformers models: ``all-linear`` skips it."""

SEQ_CLS_HEAD_NAMES: tuple[str, ...] = ("score", "classifier")
"""peft's ``SEQ_CLS_HEAD_NAMES``: heads ``all-linear`` skips in a sequence classifier."""

TASK_MODULES_TO_SAVE: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "SEQ_CLS": ("classifier", "score"),
        "TOKEN_CLS": ("classifier", "score"),
        "QUESTION_ANS": ("qa_outputs",),
    }
)
"""Heads the ``PeftModelFor<task>`` classes add to ``modules_to_save`` (``peft_model.py``)."""

_ARCHITECTURE_TASKS: tuple[tuple[str, str], ...] = (
    ("ForCausalLM", "CAUSAL_LM"),
    ("LMHeadModel", "CAUSAL_LM"),
    ("ForSeq2SeqLM", "SEQ_2_SEQ_LM"),
    ("ForSequenceClassification", "SEQ_CLS"),
    ("ForTokenClassification", "TOKEN_CLS"),
    ("ForQuestionAnswering", "QUESTION_ANS"),
)


def resolve_task_type(architecture: str, *, is_encoder_decoder: bool, spec: PeftSpec) -> str:
    """peft ``TaskType`` for a model class: ``spec.task_type`` if given, else read from the class name.

    ``...ForConditionalGeneration`` is SEQ_2_SEQ_LM for encoder-decoder models (T5, BART) and
    CAUSAL_LM otherwise; any other class (a bare ``...Model``, a masked LM) gets
    FEATURE_EXTRACTION, which adds no head and which prompt learning accepts (it needs a task type).
    """
    if spec.task_type is not None:
        return spec.task_type
    if architecture.endswith("ForConditionalGeneration"):
        return "SEQ_2_SEQ_LM" if is_encoder_decoder else "CAUSAL_LM"
    for suffix, task in _ARCHITECTURE_TASKS:
        if architecture.endswith(suffix):
            return task
    return "FEATURE_EXTRACTION"


def task_type(shape: ModelShape, spec: PeftSpec) -> str:
    return resolve_task_type(
        shape.architecture, is_encoder_decoder=shape.arch.num_encoder_layers > 0, spec=spec
    )


def module_names(params: Iterable[ParamSpec]) -> list[str]:
    """Every module that holds a parameter, parents first (the order of ``named_modules()``)."""
    seen: dict[str, None] = {}
    for p in params:
        parts = p.name.split(".")[:-1]
        for i in range(1, len(parts) + 1):
            seen.setdefault(".".join(parts[:i]), None)
    return list(seen)


def modules_to_save(modules: list[str], names: Iterable[str], *, required: Iterable[str]) -> list[str]:
    """Modules a ``ModulesToSaveWrapper`` wraps: those whose name ends with one of ``names``.

    Mirrors ``peft.utils.other._set_trainable``: a plain ``str.endswith`` over ``named_modules()``
    (``classifier`` also matches ``foo_classifier``). Only the outermost of nested matches is kept.
    A name in ``required`` (the user's) that matches nothing raises ``MemfitError``; peft ignores it
    silently, but it is usually a typo or a tied module (a tied ``lm_head`` owns no parameter here).
    """
    names = tuple(names)
    wrapped: list[str] = []
    for module in modules:
        if any(module.endswith(n) for n in names) and not under_any(module, wrapped):
            wrapped.append(module)
    for name in required:
        if not any(module.endswith(name) for module in modules):
            raise MemfitError(f"modules_to_save entry {name!r} matches no module with parameters")
    return wrapped


def under_any(name: str, modules: Iterable[str]) -> str | None:
    for module in modules:
        if name == module or name.startswith(module + "."):
            return module
    return None


def with_modules_to_save(
    params: list[tuple[ParamSpec, list[ParamSpec]]], wrapped: list[str]
) -> list[tuple[ParamSpec, list[ParamSpec]]]:
    """Rename the wrapped modules' params to ``.original_module.`` (frozen) and add trainable copies.

    ``params`` pairs each base parameter with the adapter parameters that follow it; the copy of a
    wrapped module (``copy.deepcopy`` in ``ModulesToSaveWrapper.update``) follows its last parameter.
    """
    last_index = {
        module: i for i, (p, _) in enumerate(params) for module in wrapped if under_any(p.name, [module])
    }
    out: list[tuple[ParamSpec, list[ParamSpec]]] = []
    copies: dict[str, list[ParamSpec]] = {module: [] for module in wrapped}
    for i, (p, extra) in enumerate(params):
        module = under_any(p.name, wrapped)
        if module is None:
            out.append((p, extra))
            continue
        rest = p.name[len(module) :]
        copies[module].append(ParamSpec(f"{module}.modules_to_save.{ADAPTER_NAME}{rest}", p.shape, True))
        after = [*extra, *copies[module]] if last_index[module] == i else extra
        out.append((ParamSpec(f"{module}.original_module{rest}", p.shape, False), after))
    return out


def flatten(params: list[tuple[ParamSpec, list[ParamSpec]]], prefix: str) -> tuple[ParamSpec, ...]:
    return tuple(ParamSpec(prefix + q.name, q.shape, q.trainable) for p, extra in params for q in (p, *extra))



def layer_kind(model_type: str, module: str, own: Mapping[str, ParamSpec]) -> str | None:
    """``linear``, ``conv1d``, ``embedding``, or ``None`` (not a layer LoRA can adapt).

    A layer owns exactly a 2-D ``weight`` and maybe a ``bias``. It is an Embedding if its last name
    part is in ``EMBEDDING_LAYER_NAMES``, a Conv1D if the model type is in ``CONV1D_MODEL_TYPES`` and
    the name in ``CONV1D_LAYER_NAMES``, and a Linear otherwise.
    """
    weight = own.get("weight")
    if weight is None or len(weight.shape) != 2 or set(own) - {"weight", "bias"}:
        return None
    leaf = module.rsplit(".", 1)[-1]
    if leaf in EMBEDDING_LAYER_NAMES:
        return "embedding"
    if model_type in CONV1D_MODEL_TYPES and leaf in CONV1D_LAYER_NAMES:
        return "conv1d"
    return "linear"


def own_params(params: Iterable[ParamSpec]) -> dict[str, dict[str, ParamSpec]]:
    own: dict[str, dict[str, ParamSpec]] = {}
    for p in params:
        module, _, leaf = p.name.rpartition(".")
        own.setdefault(module, {})[leaf] = p
    return own


