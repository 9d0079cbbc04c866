"""T5 (``model_type: t5``) as ``T5ForConditionalGeneration`` builds it (T0, Flan-T5, T5 v1.1).

Mirrors transformers/models/t5/modeling_t5.py. ``shared`` is the one token embedding; the encoder
and decoder ``embed_tokens`` are tied to it, so ``named_parameters`` lists only ``shared.weight``.
Each stack has ``block.N`` and a ``final_layer_norm`` (T5LayerNorm: weight only). Attention has
q, k, v ``(h d_kv, d)`` and o ``(d, h d_kv)`` without bias; only block 0's *self*-attention owns
``relative_attention_bias`` ``(buckets, h)`` (``T5Stack``: ``has_relative_attention_bias=i == 0``).
The feed-forward is ``wi``/``wo`` or, for ``feed_forward_proj: gated-*``, ``wi_0``/``wi_1``/``wo``.

``lm_head``: transformers 5 forces ``T5Config.tie_word_embeddings = True``, but
``PreTrainedModel.tie_weights`` does not tie two weights that a checkpoint holds with different
values. T5 v1.1 checkpoints (T0, Flan-T5), whose config.json says ``tie_word_embeddings: false``,
hold both, so the loaded model has its own ``lm_head.weight``; memfit lists it exactly then.

Buffers: none (relative position buckets are computed at each call).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memfit.core.families.blocks import Entry, embedding, linear, prefixed, rms_norm, specs, stack
from memfit.core.families.config_fields import read_bool, read_int, read_str
from memfit.core.model import ArchSpec, ModelShape, ParamSpec
from memfit.errors import MemfitError

ARCHITECTURE = "T5ForConditionalGeneration"


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


def _stack(
    prefix: str, count: int, block: list[Entry], relative_bias: Entry, d: int
) -> list[ParamSpec]:
    """Blocks of one stack; block 0 also has the self-attention's relative position bias."""
    first = [*block[:4], relative_bias, *block[4:]]
    return [
        *specs(prefixed(f"{prefix}.block.0", first)),
        *stack(f"{prefix}.block", count, block)[len(block):],
        *specs(rms_norm(f"{prefix}.final_layer_norm", d)),
    ]


def build_t5(name: str, config: Mapping[str, Any]) -> ModelShape:
    """Parameters of ``T5ForConditionalGeneration`` as ``from_pretrained`` leaves them."""
    vocab = read_int(config, "vocab_size", default=32128)
    d = read_int(config, "d_model", "hidden_size", default=512)
    d_kv = read_int(config, "d_kv", "head_dim", default=64)
    d_ff = read_int(config, "d_ff", default=2048)
    encoder_layers = read_int(config, "num_layers", "num_hidden_layers", default=6)
    decoder_layers = read_int(config, "num_decoder_layers", default=encoder_layers)
    heads = read_int(config, "num_heads", "num_attention_heads", default=8)
    buckets = read_int(config, "relative_attention_num_buckets", default=32)
    projection = read_str(config, "feed_forward_proj", default="relu")
    parts = projection.split("-")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise MemfitError(
            f"config.json feed_forward_proj {projection!r} is not 'ACT' or 'gated-ACT' (T5Config)"
        )
    gated = parts[0] == "gated"
    separate_head = not read_bool(config, "tie_word_embeddings", default=True)
    inner = heads * d_kv

    self_attention = [
        *_attention("layer.0.SelfAttention", d, inner),
        *rms_norm("layer.0.layer_norm", d),
    ]
    relative_bias = ("layer.0.SelfAttention.relative_attention_bias.weight", (buckets, heads))
    encoder_block = [*self_attention, *_feed_forward("layer.1", d, d_ff, gated)]
    decoder_block = [
        *self_attention,
        *_attention("layer.1.EncDecAttention", d, inner),
        *rms_norm("layer.1.layer_norm", d),
        *_feed_forward("layer.2", d, d_ff, gated),
    ]
    params = (
        *specs(embedding("shared", vocab, d)),
        *_stack("encoder", encoder_layers, encoder_block, relative_bias, d),
        *_stack("decoder", decoder_layers, decoder_block, relative_bias, d),
        *(specs(linear("lm_head", d, vocab, bias=False)) if separate_head else ()),
    )
    arch = ArchSpec(
        model_type="t5",
        num_layers=decoder_layers,
        hidden_size=d,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=d_kv,
        intermediate_size=d_ff,
        vocab_size=vocab,
        mlp_kind="gated" if gated else "gelu",
        num_encoder_layers=encoder_layers,
        max_positions=0,  # relative position buckets: no hard limit
    )
    return ModelShape(name=name, architecture=ARCHITECTURE, arch=arch, params=params)
