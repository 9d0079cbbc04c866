"""BLOOM (``model_type: bloom``) as ``BloomForCausalLM`` builds it.

Mirrors transformers/models/bloom/modeling_bloom.py: ``word_embeddings`` followed by its own
LayerNorm (``word_embeddings_layernorm``), ``h.N`` blocks and ``ln_f``; ALiBi positions carry no
parameters. Each block: ``input_layernorm``, fused ``self_attention.query_key_value`` ``(3 d, d)``
and ``dense``, ``post_attention_layernorm``, and an MLP of width 4 d (``n_inner`` is ignored), all
with biases. ``lm_head`` (no bias) is tied to ``word_embeddings`` by default. The legacy key
``n_embed`` overrides ``hidden_size`` as ``BloomConfig.__post_init__`` does.

Per block: 12 d^2 + 13 d.

Buffers: none (ALiBi slopes are computed at each call).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memfit.core.families.blocks import embedding, layer_norm, linear, specs, stack
from memfit.core.families.config_fields import divide_heads, read_bool, read_int
from memfit.core.families.heads import head_labels, decoder_head, num_labels, resolve_task
from memfit.core.model import ArchSpec, ModelShape

TASK_CLASSES = {
    "causal-lm": "BloomForCausalLM",
    "sequence-classification": "BloomForSequenceClassification",
    "token-classification": "BloomForTokenClassification",
    "question-answering": "BloomForQuestionAnswering",
}
ARCHITECTURE = TASK_CLASSES["causal-lm"]


def build_bloom(name: str, config: Mapping[str, Any], task: str | None = None) -> ModelShape:
    """Parameters of the BLOOM class for ``task``, named as ``named_parameters()`` names them."""
    task, notes = resolve_task("bloom", TASK_CLASSES, "causal-lm", config, task)
    vocab = read_int(config, "vocab_size", default=250880)
    d = read_int(config, "n_embed", "hidden_size", default=64)
    layers = read_int(config, "n_layer", "num_hidden_layers", default=2)
    heads = read_int(config, "n_head", "num_attention_heads", default=8)
    tied = read_bool(config, "tie_word_embeddings", default=True)

    block = [
        *layer_norm("input_layernorm", d),
        *linear("self_attention.query_key_value", d, 3 * d),
        *linear("self_attention.dense", d, d),
        *layer_norm("post_attention_layernorm", d),
        *linear("mlp.dense_h_to_4h", d, 4 * d),
        *linear("mlp.dense_4h_to_h", 4 * d, d),
    ]
    params = (
        *specs(embedding("transformer.word_embeddings", vocab, d)),
        *specs(layer_norm("transformer.word_embeddings_layernorm", d)),
        *stack("transformer.h", layers, block),
        *specs(layer_norm("transformer.ln_f", d)),
        *specs(decoder_head(task, d=d, vocab=vocab, labels=num_labels(config), tied=tied, token_head="classifier")),
    )
    arch = ArchSpec(
        model_type="bloom",
        num_layers=layers,
        hidden_size=d,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=divide_heads(d, heads),
        intermediate_size=4 * d,
        vocab_size=vocab,
        mlp_kind="gelu",
        max_positions=0,  # ALiBi: no position table, no hard limit in the config
        task=task,
        num_labels=head_labels(task, num_labels(config)),
    )
    return ModelShape(name=name, architecture=TASK_CLASSES[task], arch=arch, params=params, notes=notes)
