"""T5, mT5 and umT5 (``model_type: t5``, ``mt5``, ``umt5``) as transformers builds them.

Mirrors transformers/models/t5/modeling_t5.py (mt5/ and umt5/ are copies with other defaults).
``shared`` is the one token embedding; the encoder and decoder ``embed_tokens`` are tied to it, so
``named_parameters`` lists only ``shared.weight``. Each stack has ``block.N`` and a
``final_layer_norm`` (T5LayerNorm: weight only). Attention has q, k, v ``(h d_kv, d)`` and o
``(d, h d_kv)`` without bias; the self-attention's ``relative_attention_bias`` ``(buckets, h)`` is
only in block 0 for T5/mT5 (``T5Stack``: ``has_relative_attention_bias=i == 0``) and in every block
for umT5 (``UMT5LayerSelfAttention``). Decoder blocks add ``EncDecAttention`` (cross-attention).
The feed-forward is ``wi``/``wo`` (original T5: ReLU) or, for ``feed_forward_proj: gated-*`` (T5 v1.1,
Flan-T5, mT5, umT5: gated GELU), ``wi_0``/``wi_1``/``wo``.

``lm_head``: transformers 5 forces ``tie_word_embeddings = True`` in these configs, but
``PreTrainedModel.tie_weights`` does not tie two weights that a checkpoint holds with different
values. T5 v1.1 checkpoints (T0, Flan-T5, mT5), whose config.json says ``tie_word_embeddings: false``,
hold both, so the loaded model has its own ``lm_head.weight``; memfit lists it exactly then.

Heads: ``<T5|MT5|UMT5>ForConditionalGeneration`` (seq2seq LM), ``ForSequenceClassification``
(``transformer.`` = the whole model, plus ``classification_head.dense``/``out_proj``),
``ForTokenClassification`` (``transformer.`` = the encoder only, plus ``classifier``),
``ForQuestionAnswering`` (encoder and decoder, plus ``qa_outputs`` of ``num_labels`` outputs).

Buffers: none (relative position buckets are computed at each call).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memfit.core.families.blocks import Entry, embedding, linear, prefixed, rms_norm, specs, stack
from memfit.core.families.config_fields import read_bool, read_float, read_int, read_str
from memfit.core.families.heads import head_labels, num_labels, resolve_task
from memfit.core.model import ArchSpec, LayerLayout, ModelShape, ParamSpec
from memfit.errors import MemfitError

_PREFIX = {"t5": "T5", "mt5": "MT5", "umt5": "UMT5"}
TASK_CLASSES = {
    model_type: {
        "seq2seq-lm": f"{p}ForConditionalGeneration",
        "sequence-classification": f"{p}ForSequenceClassification",
        "token-classification": f"{p}ForTokenClassification",
        "question-answering": f"{p}ForQuestionAnswering",
    }
    for model_type, p in _PREFIX.items()
}
ARCHITECTURE = TASK_CLASSES["t5"]["seq2seq-lm"]

# Config-class defaults: (vocab, d_model, d_ff, num_layers, num_heads, feed_forward_proj)
_DEFAULTS = {
    "t5": (32128, 512, 2048, 6, 8, "relu"),
    "mt5": (250112, 512, 1024, 8, 6, "gated-gelu"),
    "umt5": (250112, 512, 1024, 8, 6, "gated-gelu"),
}
_ACTS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_tanh", "silu": "silu"}


def _attention(name: str, d: int, inner: int) -> list[Entry]:
    return [
        *linear(f"{name}.q", d, inner, bias=False),
        *linear(f"{name}.k", d, inner, bias=False),
        *linear(f"{name}.v", d, inner, bias=False),
        *linear(f"{name}.o", inner, d, bias=False),
    ]


def _feed_forward(name: str, d: int, d_ff: int, gated: bool) -> list[Entry]:
    dense = f"{name}.DenseReluDense"
    ins = ("wi_0", "wi_1") if gated else ("wi",)
    return [
        *(entry for w in ins for entry in linear(f"{dense}.{w}", d, d_ff, bias=False)),
        *linear(f"{dense}.wo", d_ff, d, bias=False),
        *rms_norm(f"{name}.layer_norm", d),
    ]


def _stack(prefix: str, count: int, block: list[Entry], relative_bias: Entry, d: int, every: bool) -> list[ParamSpec]:
    """Blocks of one stack; block 0 (every block for umT5) also has the relative position bias."""
    first = [*block[:4], relative_bias, *block[4:]]
    if every:
        blocks = stack(f"{prefix}.block", count, first)
    else:
        blocks = [*specs(prefixed(f"{prefix}.block.0", first)), *stack(f"{prefix}.block", count, block)[len(block):]]
    return [*blocks, *specs(rms_norm(f"{prefix}.final_layer_norm", d))]


def build_t5(name: str, config: Mapping[str, Any], task: str | None = None) -> ModelShape:
    """Parameters of the T5-family class for ``task`` as ``from_pretrained`` leaves them."""
    model_type = config["model_type"]
    classes = TASK_CLASSES[model_type]
    task, notes = resolve_task(model_type, classes, "seq2seq-lm", config, task)
    vocab_d, d_d, ff_d, layers_d, heads_d, proj_d = _DEFAULTS[model_type]
    vocab = read_int(config, "vocab_size", default=vocab_d)
    d = read_int(config, "d_model", "hidden_size", default=d_d)
    d_kv = read_int(config, "d_kv", "head_dim", default=64)
    d_ff = read_int(config, "d_ff", default=ff_d)
    encoder_layers = read_int(config, "num_layers", "num_hidden_layers", default=layers_d)
    decoder_layers = read_int(config, "num_decoder_layers", default=encoder_layers)
    heads = read_int(config, "num_heads", "num_attention_heads", default=heads_d)
    buckets = read_int(config, "relative_attention_num_buckets", default=32)
    projection = read_str(config, "feed_forward_proj", default=proj_d)
    parts = projection.split("-")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise MemfitError(
            f"config.json feed_forward_proj {projection!r} is not 'ACT' or 'gated-ACT' (T5Config)"
        )
    gated = parts[0] == "gated"
    act = "gelu_new" if projection == "gated-gelu" else parts[-1]  # T5Config: gated-gelu means gelu_new
    separate_head = not read_bool(config, "tie_word_embeddings", default=True)
    inner = heads * d_kv
    labels = num_labels(config)
    every = model_type == "umt5"

    self_attention = [*_attention("layer.0.SelfAttention", d, inner), *rms_norm("layer.0.layer_norm", d)]
    relative_bias = ("layer.0.SelfAttention.relative_attention_bias.weight", (buckets, heads))
    encoder_block = [*self_attention, *_feed_forward("layer.1", d, d_ff, gated)]
    decoder_block = [
        *self_attention,
        *_attention("layer.1.EncDecAttention", d, inner),
        *rms_norm("layer.1.layer_norm", d),
        *_feed_forward("layer.2", d, d_ff, gated),
    ]
    base = "transformer." if task in ("sequence-classification", "token-classification") else ""
    body = [
        *specs(embedding(f"{base}shared", vocab, d)),
        *_stack(f"{base}encoder", encoder_layers, encoder_block, relative_bias, d, every),
    ]
    if task != "token-classification":
        body += _stack(f"{base}decoder", decoder_layers, decoder_block, relative_bias, d, every)
    if task == "seq2seq-lm":
        head = linear("lm_head", d, vocab, bias=False) if separate_head else []
    elif task == "sequence-classification":
        head = [*linear("classification_head.dense", d, d), *linear("classification_head.out_proj", d, labels)]
    elif task == "token-classification":
        head = linear("classifier", d, labels)
    else:
        head = linear("qa_outputs", d, labels)
    params = (*body, *specs(head))
    layout = LayerLayout(
        family="t5", norm="rms", act=_ACTS.get(act, "gelu"), gated=gated, relative_attention="t5",
        relative_buckets=buckets, hidden_dropout=read_float(config, "dropout_rate", default=0.1) or 0.0,
        attention_dropout=read_float(config, "dropout_rate", default=0.1) or 0.0,
        tied_embeddings=not separate_head,
        classifier_dropout=read_float(config, "classifier_dropout", default=0.0) or 0.0,
    )
    arch = ArchSpec(
        model_type=model_type,
        num_layers=encoder_layers if task == "token-classification" else decoder_layers,
        hidden_size=d,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=d_kv,
        intermediate_size=d_ff,
        vocab_size=vocab,
        mlp_kind="gated" if gated else "gelu",
        num_encoder_layers=0 if task == "token-classification" else encoder_layers,
        is_encoder_only=task == "token-classification",
        max_positions=0,  # relative position buckets: no hard limit
        task=task,
        num_labels=head_labels(task, labels, qa=labels),
        layout=layout,
    )
    return ModelShape(name=name, architecture=classes[task], arch=arch, params=params, notes=notes)
