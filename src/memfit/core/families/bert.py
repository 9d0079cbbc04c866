"""BERT (``model_type: bert``) as ``BertForMaskedLM`` builds it.

Mirrors transformers/models/bert/modeling_bert.py. ``BertForMaskedLM`` builds
``BertModel(add_pooling_layer=False)`` (no pooler) and ``cls.predictions``: a ``transform``
(dense + LayerNorm), an output ``bias`` ``(vocab,)`` and a ``decoder`` Linear whose weight is tied
to ``word_embeddings`` and whose bias is tied to ``cls.predictions.bias`` unless
``tie_word_embeddings: false`` (then both are their own parameters). Embeddings: word, absolute
positions, token types and a LayerNorm. Each layer: q/k/v, output dense and LayerNorm,
``intermediate.dense`` and ``output.dense`` with LayerNorm, all with biases; decoders with
``add_cross_attention`` add a ``crossattention`` block of the same shape.

Per layer: 4 d^2 + 2 d i + 9 d + i.

Buffers (``BertEmbeddings``): ``position_ids`` (``arange(max_position_embeddings)`` expanded to
``(1, P)``) and ``token_type_ids`` (zeros of the same shape), both int64 and non-persistent:
16 P bytes, 8 KiB for bert-large (P = 512).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memfit.core.families.blocks import Entry, embedding, layer_norm, linear, prefixed, specs, stack
from memfit.core.families.config_fields import divide_heads, read_bool, read_int
from memfit.core.model import ArchSpec, BufferSpec, ModelShape
from memfit.errors import MemfitError

ARCHITECTURE = "BertForMaskedLM"


def _attention(d: int) -> list[Entry]:
    return [
        *linear("self.query", d, d),
        *linear("self.key", d, d),
        *linear("self.value", d, d),
        *linear("output.dense", d, d),
        *layer_norm("output.LayerNorm", d),
    ]


def build_bert(name: str, config: Mapping[str, Any]) -> ModelShape:
    """Parameters and buffers of ``BertForMaskedLM(config)``, named as torch names them."""
    vocab = read_int(config, "vocab_size", default=30522)
    d = read_int(config, "hidden_size", default=768)
    layers = read_int(config, "num_hidden_layers", default=12)
    heads = read_int(config, "num_attention_heads", default=12)
    inner = read_int(config, "intermediate_size", default=3072)
    positions = read_int(config, "max_position_embeddings", default=512)
    token_types = read_int(config, "type_vocab_size", default=2)
    tied = read_bool(config, "tie_word_embeddings", default=True)
    cross = read_bool(config, "add_cross_attention", default=False)
    if cross and not read_bool(config, "is_decoder", default=False):
        raise MemfitError(
            "config.json sets add_cross_attention without is_decoder (BertLayer rejects it)"
        )

    block = prefixed("attention", _attention(d))
    if cross:
        block += prefixed("crossattention", _attention(d))
    block += [
        *linear("intermediate.dense", d, inner),
        *linear("output.dense", inner, d),
        *layer_norm("output.LayerNorm", d),
    ]
    head = [
        ("cls.predictions.bias", (vocab,)),
        *linear("cls.predictions.transform.dense", d, d),
        *layer_norm("cls.predictions.transform.LayerNorm", d),
    ]
    if not tied:
        head += linear("cls.predictions.decoder", d, vocab)
    params = (
        *specs(embedding("bert.embeddings.word_embeddings", vocab, d)),
        *specs(embedding("bert.embeddings.position_embeddings", positions, d)),
        *specs(embedding("bert.embeddings.token_type_embeddings", token_types, d)),
        *specs(layer_norm("bert.embeddings.LayerNorm", d)),
        *stack("bert.encoder.layer", layers, block),
        *specs(head),
    )
    arch = ArchSpec(
        model_type="bert",
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
    )
    buffers = tuple(
        BufferSpec(f"bert.embeddings.{ids}", (1, positions), "int64", persistent=False)
        for ids in ("position_ids", "token_type_ids")
    )
    return ModelShape(
        name=name, architecture=ARCHITECTURE, arch=arch, params=params, buffers=buffers
    )
