"""DeBERTa-v2/v3 (``model_type: deberta-v2``) as transformers/models/deberta_v2/modeling_deberta_v2.py builds it.

``deberta.embeddings``: ``word_embeddings`` of width ``embedding_size`` (default hidden),
``position_embeddings`` only with ``position_biased_input`` (default true; false in DeBERTa-v3),
``token_type_embeddings`` only with ``type_vocab_size > 0``, ``embed_proj`` when the embedding width
differs, a LayerNorm. ``deberta.encoder``: ``layer.N`` as BERT's but with
``attention.self.query_proj``/``key_proj``/``value_proj`` (+ ``pos_key_proj``/``pos_query_proj`` for
c2p/p2c without ``share_att_key``); with ``relative_attention`` the shared ``rel_embeddings``
(``2 x position_buckets`` rows, else ``2 x max_relative_positions``, which defaults to
``max_position_embeddings``) and, with ``norm_rel_ebd: layer_norm``, ``encoder.LayerNorm``; with
``conv_kernel_size > 0`` a ``conv`` (Conv1d + LayerNorm).

Heads: masked LM ``cls.predictions`` (``legacy``, the default: transform dense to the embedding
width + LayerNorm, a ``bias`` and a ``decoder`` tied to the word embedding) or ``lm_predictions.lm_head``;
sequence classification ``pooler.dense`` (``pooler_hidden_size``) + ``classifier``; token
classification ``classifier``; question answering ``qa_outputs`` (``num_labels``).

Buffers: ``deberta.embeddings.position_ids`` (int64, ``(1, max_position_embeddings)``, not saved).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memfit.core.families.bert import ACTS
from memfit.core.families.blocks import Entry, embedding, layer_norm, linear, prefixed, specs, stack
from memfit.core.families.config_fields import divide_heads, read_bool, read_float, read_int, read_str
from memfit.core.families.heads import head_labels, num_labels, resolve_task
from memfit.core.model import ArchSpec, BufferSpec, LayerLayout, ModelShape
from memfit.errors import MemfitError

TASK_CLASSES = {
    "masked-lm": "DebertaV2ForMaskedLM",
    "sequence-classification": "DebertaV2ForSequenceClassification",
    "token-classification": "DebertaV2ForTokenClassification",
    "question-answering": "DebertaV2ForQuestionAnswering",
}


def _pos_att_type(config: Mapping[str, Any]) -> tuple[str, ...]:
    value = config.get("pos_att_type")
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(x.strip() for x in value.lower().split("|"))
    if isinstance(value, list | tuple) and all(isinstance(x, str) for x in value):
        return tuple(value)
    raise MemfitError(f"config.json field 'pos_att_type' must be a list of c2p/p2c, got {value!r}")


def build_deberta_v2(name: str, config: Mapping[str, Any], task: str | None = None) -> ModelShape:
    """Parameters and buffers of the DeBERTa-v2 class for ``task``."""
    task, notes = resolve_task("deberta-v2", TASK_CLASSES, "masked-lm", config, task)
    vocab = read_int(config, "vocab_size", default=128100)
    d = read_int(config, "hidden_size", default=1536)
    layers = read_int(config, "num_hidden_layers", default=24)
    heads = read_int(config, "num_attention_heads", default=24)
    inner = read_int(config, "intermediate_size", default=6144)
    positions = read_int(config, "max_position_embeddings", default=512)
    token_types = read_int(config, "type_vocab_size", default=0, minimum=0)
    emb = read_int(config, "embedding_size", default=d)
    relative = read_bool(config, "relative_attention", default=False)
    pos_types = _pos_att_type(config)
    share = read_bool(config, "share_att_key", default=False)
    tied = read_bool(config, "tie_word_embeddings", default=True)
    legacy = read_bool(config, "legacy", default=True)
    labels = num_labels(config)
    max_rel = config.get("max_relative_positions", -1)
    max_rel = positions if not isinstance(max_rel, int) or isinstance(max_rel, bool) or max_rel < 1 else max_rel
    buckets = config.get("position_buckets", -1)
    buckets = buckets if isinstance(buckets, int) and not isinstance(buckets, bool) else -1
    att_span = buckets if buckets > 0 else max_rel

    embeddings: list[Entry] = [*embedding("word_embeddings", vocab, emb)]
    if read_bool(config, "position_biased_input", default=True):
        embeddings += embedding("position_embeddings", positions, emb)
    if token_types > 0:
        embeddings += embedding("token_type_embeddings", token_types, emb)
    if emb != d:
        embeddings += linear("embed_proj", emb, d, bias=False)
    embeddings += layer_norm("LayerNorm", d)

    attention = [*linear("self.query_proj", d, d), *linear("self.key_proj", d, d), *linear("self.value_proj", d, d)]
    if relative and not share:
        if "c2p" in pos_types:
            attention += linear("self.pos_key_proj", d, d)
        if "p2c" in pos_types:
            attention += linear("self.pos_query_proj", d, d)
    attention += [*linear("output.dense", d, d), *layer_norm("output.LayerNorm", d)]
    block = [
        *prefixed("attention", attention),
        *linear("intermediate.dense", d, inner),
        *linear("output.dense", inner, d),
        *layer_norm("output.LayerNorm", d),
    ]
    encoder: list[Entry] = []
    if relative:
        encoder += embedding("rel_embeddings", 2 * att_span, d)
    norm_rel = [x.strip() for x in read_str(config, "norm_rel_ebd", default="none").lower().split("|")]
    if "layer_norm" in norm_rel:
        encoder += layer_norm("LayerNorm", d)
    kernel = read_int(config, "conv_kernel_size", default=0, minimum=0)
    if kernel > 0:
        groups = read_int(config, "conv_groups", default=1)
        encoder += [("conv.conv.weight", (d, d // groups, kernel)), ("conv.conv.bias", (d,)), *layer_norm("conv.LayerNorm", d)]

    if task == "masked-lm":
        if legacy:
            head = [
                ("cls.predictions.bias", (vocab,)),
                *linear("cls.predictions.transform.dense", d, emb),
                *layer_norm("cls.predictions.transform.LayerNorm", emb),
                *([] if tied else linear("cls.predictions.decoder", emb, vocab)),
            ]
        else:
            head = [
                ("lm_predictions.lm_head.bias", (vocab,)),
                *linear("lm_predictions.lm_head.dense", d, d),
                *layer_norm("lm_predictions.lm_head.LayerNorm", d),
            ]
    elif task == "sequence-classification":
        pooled = read_int(config, "pooler_hidden_size", default=d)
        head = [*linear("pooler.dense", pooled, pooled), *linear("classifier", d, labels)]
    elif task == "token-classification":
        head = linear("classifier", d, labels)
    else:
        head = linear("qa_outputs", d, labels)
    params = (
        *specs(prefixed("deberta.embeddings", embeddings)),
        *stack("deberta.encoder.layer", layers, block),
        *specs(prefixed("deberta.encoder", encoder)),
        *specs(head),
    )
    act = config.get("hidden_act", "gelu")
    layout = LayerLayout(
        family="bert", norm="layer", act=ACTS.get(act, "gelu") if isinstance(act, str) else "gelu", gated=False,
        hidden_dropout=read_float(config, "hidden_dropout_prob", default=0.1) or 0.0,
        attention_dropout=read_float(config, "attention_probs_dropout_prob", default=0.1) or 0.0,
        relative_attention="deberta" if relative else "", position_buckets=att_span if relative else 0,
        tied_embeddings=tied, pooler=task == "sequence-classification", head_transform=task == "masked-lm",
        classifier_dropout=(read_float(config, "cls_dropout", default=None) if config.get("cls_dropout") is not None
                            else read_float(config, "hidden_dropout_prob", default=0.1)) or 0.0,
    )
    arch = ArchSpec(
        model_type="deberta-v2", num_layers=layers, hidden_size=d, num_heads=heads, num_kv_heads=heads,
        head_dim=divide_heads(d, heads), intermediate_size=inner, vocab_size=vocab, mlp_kind="gelu",
        is_encoder_only=True, max_positions=positions, task=task, num_labels=head_labels(task, labels, qa=labels),
        layout=layout,
    )
    buffers = (BufferSpec("deberta.embeddings.position_ids", (1, positions), "int64", persistent=False),)
    return ModelShape(name=name, architecture=TASK_CLASSES[task], arch=arch, params=params, buffers=buffers,
                      notes=notes)
