"""Task heads: which transformers class a plan sizes, and the parameters its head adds.

A task is what the class computes on top of the backbone. memfit takes it from ``--task`` or, by
default, from the config's ``architectures[0]`` (its class-name suffix), else the family's usual
head (causal LM for decoders, seq2seq LM for T5, masked LM for BERT); the class for a task is the
one transformers' auto mappings name for that ``model_type`` (``MODEL_FOR_<TASK>_MAPPING_NAMES`` in
transformers/models/auto/modeling_auto.py; each family's ``TASK_CLASSES`` copies them and a test
compares). The head changes the parameters, the logits (vocabulary, labels, or 2 for question
answering) and the activations.

Heads, as the classes build them (transformers 5):
- causal/masked LM: ``lm_head`` (vocab x d, tied to the input embedding unless the config unties it);
- sequence classification: decoders ``score`` (labels x d, no bias; GenericForSequenceClassification
  in transformers/modeling_layers.py), encoders ``classifier`` (+ BERT's pooler);
- token classification: ``score`` with bias (GenericForTokenClassification) or ``classifier``;
- question answering: ``qa_outputs`` (2 x d, bias): start and end logits per position.

``num_labels`` is ``len(id2label)`` when the config has one, else ``num_labels``, else 2
(``PreTrainedConfig.__init__``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memfit.core.families.blocks import Entry, linear
from memfit.errors import MemfitError

TASKS = (
    "causal-lm",
    "masked-lm",
    "seq2seq-lm",
    "sequence-classification",
    "token-classification",
    "question-answering",
)

_SUFFIXES = (
    ("ForCausalLM", "causal-lm"),
    ("LMHeadModel", "causal-lm"),
    ("ForConditionalGeneration", "seq2seq-lm"),
    ("ForMaskedLM", "masked-lm"),
    ("ForSequenceClassification", "sequence-classification"),
    ("ForTokenClassification", "token-classification"),
    ("ForQuestionAnswering", "question-answering"),
)


def task_of_class(name: str) -> str | None:
    """The task a transformers class name ends with (``GPT2LMHeadModel`` -> ``causal-lm``)."""
    for suffix, task in _SUFFIXES:
        if name.endswith(suffix):
            return task
    return None


def num_labels(config: Mapping[str, Any]) -> int:
    """Labels of a classification head, as ``PreTrainedConfig`` derives them."""
    id2label = config.get("id2label")
    if isinstance(id2label, Mapping) and id2label:
        return len(id2label)
    value = config.get("num_labels")
    if value is None:
        return 2
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MemfitError(f"config.json field 'num_labels' must be a positive integer, got {value!r}")
    return value


def resolve_task(
    model_type: str,
    classes: Mapping[str, str],
    default: str,
    config: Mapping[str, Any],
    requested: str | None,
) -> tuple[str, tuple[str, ...]]:
    """``(task, notes)``: ``requested`` if given (it must be one this family has), else the task of
    ``architectures[0]``, else ``default``; notes say what was chosen when it is not obvious."""
    if requested is not None:
        if requested not in TASKS:
            raise MemfitError(f"--task must be one of {', '.join(TASKS)}, got {requested!r}")
        if requested not in classes:
            raise MemfitError(
                f"transformers has no {requested} class for model_type {model_type!r} "
                f"(it has: {', '.join(classes)})"
            )
        return requested, ()
    archs = config.get("architectures")
    first = archs[0] if isinstance(archs, list | tuple) and archs and isinstance(archs[0], str) else None
    if first is None:
        return default, ()
    task = task_of_class(first)
    if task in classes:
        return task, ()
    return default, (
        f"architectures[0] is {first}, which memfit does not size; planned as {classes[default]} "
        f"(pass --task to choose: {', '.join(classes)})",
    )


def decoder_head(
    task: str,
    *,
    d: int,
    vocab: int,
    labels: int,
    tied: bool,
    lm_bias: bool = False,
    token_head: str = "score",
    token_bias: bool = True,
    qa_width: int = 2,
) -> list[Entry]:
    """Head parameters of a decoder-only class (names relative to the model root)."""
    if task == "causal-lm":
        head = linear("lm_head", d, vocab, bias=lm_bias)
        return head[1:] if tied else head  # a tied lm_head's weight is the input embedding's
    if task == "sequence-classification":
        return linear("score", d, labels, bias=False)
    if task == "token-classification":
        return linear(token_head, d, labels, bias=token_bias)
    if task == "question-answering":
        return linear("qa_outputs", d, qa_width)
    raise AssertionError(task)  # resolve_task only returns tasks the family lists


def logits_width(task: str, vocab: int, labels: int) -> int:
    """Logits per position (per sequence for sequence classification) of the head."""
    if task in ("causal-lm", "masked-lm", "seq2seq-lm"):
        return vocab
    if task == "question-answering":
        return 2
    return labels


def head_labels(task: str, labels: int, qa: int = 2) -> int:
    """``ArchSpec.num_labels``: outputs of a classification or QA head, 0 for language models."""
    if task in ("sequence-classification", "token-classification"):
        return labels
    return qa if task == "question-answering" else 0
