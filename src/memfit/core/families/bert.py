"""BERT and RoBERTa (``model_type: bert``, ``roberta``) as transformers builds them.

Mirrors transformers/models/bert/modeling_bert.py and roberta/modeling_roberta.py. The backbone
(``bert.`` / ``roberta.``): embeddings (word, absolute positions, token types, a LayerNorm) and
``encoder.layer.N`` with q/k/v, output dense and LayerNorm, ``intermediate.dense`` and
``output.dense`` with LayerNorm, all with biases; decoders with ``add_cross_attention`` add a
``crossattention`` block of the same shape. Heads:

- masked LM: BERT ``cls.predictions`` (``transform`` dense + LayerNorm, an output ``bias``, a
  ``decoder`` tied to ``word_embeddings`` unless ``tie_word_embeddings: false``); RoBERTa
  ``lm_head`` (dense, layer_norm, bias, decoder likewise);
- sequence classification: BERT's pooler (``bert.pooler.dense``) and ``classifier``; RoBERTa
  ``classifier.dense`` + ``classifier.out_proj`` (no pooler);
- token classification: ``classifier``; question answering: ``qa_outputs`` of ``num_labels`` outputs.

Per layer: 4 d^2 + 2 d i + 9 d + i.

Buffers (``<Bert|Roberta>Embeddings``): ``position_ids`` (``arange(max_position_embeddings)``
expanded to ``(1, P)``) and ``token_type_ids`` (zeros of the same shape), both int64 and
non-persistent: 16 P bytes, 8 KiB for bert-large (P = 512).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memfit.core.families.blocks import Entry, embedding, layer_norm, linear, prefixed, specs, stack
from memfit.core.families.config_fields import divide_heads, read_bool, read_float, read_int
from memfit.core.families.heads import head_labels, num_labels, resolve_task
from memfit.core.model import ArchSpec, BufferSpec, LayerLayout, ModelShape
from memfit.errors import MemfitError

_PREFIX = {"bert": "Bert", "roberta": "Roberta"}
TASK_CLASSES = {
    model_type: {
        "masked-lm": f"{p}ForMaskedLM",
        "sequence-classification": f"{p}ForSequenceClassification",
        "token-classification": f"{p}ForTokenClassification",
        "question-answering": f"{p}ForQuestionAnswering",
    }
    for model_type, p in _PREFIX.items()
}
ARCHITECTURE = TASK_CLASSES["bert"]["masked-lm"]
# Config-class defaults: (vocab_size, max_position_embeddings)
_DEFAULTS = {"bert": (30522, 512), "roberta": (50265, 512)}
ACTS = {"gelu": "gelu", "gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu", "silu": "silu",
        "tanh": "tanh", "gelu_fast": "gelu_new"}


def _attention(d: int) -> list[Entry]:
    return [
        *linear("self.query", d, d),
        *linear("self.key", d, d),
        *linear("self.value", d, d),
        *linear("output.dense", d, d),
        *layer_norm("output.LayerNorm", d),
    ]


def encoder_block(d: int, inner: int, *, cross: bool = False) -> list[Entry]:
    """One ``BertLayer``: attention (+ cross-attention), intermediate and output."""
    block = prefixed("attention", _attention(d))
    if cross:
        block += prefixed("crossattention", _attention(d))
    return [
        *block,
        *linear("intermediate.dense", d, inner),
        *linear("output.dense", inner, d),
        *layer_norm("output.LayerNorm", d),
    ]


def build_bert(name: str, config: Mapping[str, Any], task: str | None = None) -> ModelShape:
    """Parameters and buffers of the BERT/RoBERTa class for ``task``, named as torch names them."""
    model_type = config["model_type"]
    classes = TASK_CLASSES[model_type]
    task, notes = resolve_task(model_type, classes, "masked-lm", config, task)
    roberta = model_type == "roberta"
    vocab_d, positions_d = _DEFAULTS[model_type]
    vocab = read_int(config, "vocab_size", default=vocab_d)
    d = read_int(config, "hidden_size", default=768)
    layers = read_int(config, "num_hidden_layers", default=12)
    heads = read_int(config, "num_attention_heads", default=12)
    inner = read_int(config, "intermediate_size", default=3072)
    positions = read_int(config, "max_position_embeddings", default=positions_d)
    token_types = read_int(config, "type_vocab_size", default=2)
    tied = read_bool(config, "tie_word_embeddings", default=True)
    cross = read_bool(config, "add_cross_attention", default=False)
    if cross and not read_bool(config, "is_decoder", default=False):
        raise MemfitError(
            "config.json sets add_cross_attention without is_decoder (BertLayer rejects it)"
        )
    labels = num_labels(config)
    base = model_type

    if task == "masked-lm":
        if roberta:
            head = [
                ("lm_head.bias", (vocab,)),
                *linear("lm_head.dense", d, d),
                *layer_norm("lm_head.layer_norm", d),
                *([] if tied else linear("lm_head.decoder", d, vocab)),
            ]
        else:
            head = [
                ("cls.predictions.bias", (vocab,)),
                *linear("cls.predictions.transform.dense", d, d),
                *layer_norm("cls.predictions.transform.LayerNorm", d),
                *([] if tied else linear("cls.predictions.decoder", d, vocab)),
            ]
    elif task == "sequence-classification":
        if roberta:
            head = [*linear("classifier.dense", d, d), *linear("classifier.out_proj", d, labels)]
        else:
            head = [*linear("bert.pooler.dense", d, d), *linear("classifier", d, labels)]
    elif task == "token-classification":
        head = linear("classifier", d, labels)
    else:
        head = linear("qa_outputs", d, labels)
    params = (
        *specs(embedding(f"{base}.embeddings.word_embeddings", vocab, d)),
        *specs(embedding(f"{base}.embeddings.position_embeddings", positions, d)),
        *specs(embedding(f"{base}.embeddings.token_type_embeddings", token_types, d)),
        *specs(layer_norm(f"{base}.embeddings.LayerNorm", d)),
        *stack(f"{base}.encoder.layer", layers, encoder_block(d, inner, cross=cross)),
        *specs(head),
    )
    act = config.get("hidden_act", "gelu")
    layout = LayerLayout(
        family="bert", norm="layer", act=ACTS.get(act, "gelu") if isinstance(act, str) else "gelu", gated=False,
        hidden_dropout=read_float(config, "hidden_dropout_prob", default=0.1) or 0.0,
        attention_dropout=read_float(config, "attention_probs_dropout_prob", default=0.1) or 0.0,
        tied_embeddings=tied, pooler=task == "sequence-classification" and not roberta,
        head_transform=task == "masked-lm",
        classifier_dropout=(read_float(config, "classifier_dropout", default=None) if config.get("classifier_dropout")
                            is not None else read_float(config, "hidden_dropout_prob", default=0.1)) or 0.0,
    )
    arch = ArchSpec(
        model_type=model_type,
        num_layers=layers,
        hidden_size=d,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=divide_heads(d, heads),
        intermediate_size=inner,
        vocab_size=vocab,
        mlp_kind="gelu",
        is_encoder_only=True,
        max_positions=positions,
        task=task,
        num_labels=head_labels(task, labels, qa=labels),
        layout=layout,
    )
    buffers = tuple(
        BufferSpec(f"{base}.embeddings.{ids}", (1, positions), "int64", persistent=False)
        for ids in ("position_ids", "token_type_ids")
    )
    return ModelShape(
        name=name, architecture=classes[task], arch=arch, params=params, buffers=buffers, notes=notes
    )
