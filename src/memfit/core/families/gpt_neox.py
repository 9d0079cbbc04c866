"""GPT-NeoX (``model_type: gpt_neox``, Pythia) as transformers/models/gpt_neox/modeling_gpt_neox.py builds it.

``gpt_neox.embed_in``, ``gpt_neox.layers.N`` and ``gpt_neox.final_layer_norm``; ``lm_head`` (no
bias, its own parameter: ``GPTNeoXConfig.tie_word_embeddings = False``; checkpoints call it
``embed_out``, transformers 5 renames it on load). Each layer: ``input_layernorm`` and
``post_attention_layernorm`` (LayerNorm with bias), fused ``attention.query_key_value`` ``(3 d, d)``
and ``attention.dense`` (bias with ``attention_bias``, default true), and an MLP
``dense_h_to_4h``/``dense_4h_to_h`` of width ``intermediate_size`` with biases.
``use_parallel_residual`` (default true) adds attention and MLP to one residual, without parameters.

Per layer: 4 d^2 + 2 d i + 9 d + i (with attention biases).

Buffers: ``gpt_neox.rotary_emb.inv_freq``/``original_inv_freq``: GPT-NeoX's own default RoPE rotates
``int(head_dim x partial_rotary_factor)`` channels; the factor is the rope dict's, else the legacy
``rotary_pct``, else 0.25 (``GPTNeoXConfig.convert_rope_params_to_dict``). Pythia-1.4B: 2 x 16 x 4 B.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memfit.core.families.blocks import embedding, layer_norm, linear, specs, stack
from memfit.core.families.config_fields import divide_heads, read_bool, read_float, read_int
from memfit.core.families.heads import head_labels, decoder_head, num_labels, resolve_task
from memfit.core.families.rope import rope_dict, rope_frequencies, rotary_buffers
from memfit.core.families.validate import check_rope
from memfit.core.model import ArchSpec, LayerLayout, ModelShape

TASK_CLASSES = {
    "causal-lm": "GPTNeoXForCausalLM",
    "sequence-classification": "GPTNeoXForSequenceClassification",
    "token-classification": "GPTNeoXForTokenClassification",
    "question-answering": "GPTNeoXForQuestionAnswering",
}
ARCHITECTURE = TASK_CLASSES["causal-lm"]

_ACTS = {"gelu": "gelu", "gelu_new": "gelu_new", "gelu_fast": "gelu_new", "relu": "relu",
         "gelu_pytorch_tanh": "gelu_tanh", "silu": "silu"}


def build_gpt_neox(name: str, config: Mapping[str, Any], task: str | None = None) -> ModelShape:
    """Parameters and buffers of the GPT-NeoX class for ``task``."""
    task, notes = resolve_task("gpt_neox", TASK_CLASSES, "causal-lm", config, task)
    vocab = read_int(config, "vocab_size", default=50432)
    d = read_int(config, "hidden_size", default=6144)
    layers = read_int(config, "num_hidden_layers", default=44)
    heads = read_int(config, "num_attention_heads", default=64)
    inner = read_int(config, "intermediate_size", default=24576)
    positions = read_int(config, "max_position_embeddings", default=2048)
    tied = read_bool(config, "tie_word_embeddings", default=False)
    bias = read_bool(config, "attention_bias", default=True)
    parallel = read_bool(config, "use_parallel_residual", default=True)
    hd = divide_heads(d, heads)
    rope = dict(rope_dict(config))
    if "partial_rotary_factor" not in rope:
        rope["partial_rotary_factor"] = read_float(config, "rotary_pct", default=0.25)
    check_rope({"rope_theta": config.get("rotary_emb_base")})
    frequencies = rope_frequencies(config, hd, rope=rope, default_partial=True)
    labels = num_labels(config)

    block = [
        *layer_norm("input_layernorm", d),
        *layer_norm("post_attention_layernorm", d),
        *linear("attention.query_key_value", d, 3 * d, bias=bias),
        *linear("attention.dense", d, d, bias=bias),
        *linear("mlp.dense_h_to_4h", d, inner),
        *linear("mlp.dense_4h_to_h", inner, d),
    ]
    params = (
        *specs(embedding("gpt_neox.embed_in", vocab, d)),
        *stack("gpt_neox.layers", layers, block),
        *specs(layer_norm("gpt_neox.final_layer_norm", d)),
        *specs(decoder_head(task, d=d, vocab=vocab, labels=labels, tied=tied, token_head="classifier")),
    )
    act = config.get("hidden_act", "gelu")
    layout = LayerLayout(
        family="neox", norm="layer", act=_ACTS.get(act, "gelu") if isinstance(act, str) else "gelu",
        gated=False, fused_qkv=True, parallel=parallel, rotary_dim=2 * frequencies,
        hidden_dropout=read_float(config, "hidden_dropout", default=0.0) or 0.0,
        attention_dropout=read_float(config, "attention_dropout", default=0.0) or 0.0,
        tied_embeddings=tied,
        classifier_dropout=read_float(config, "classifier_dropout", default=0.1) or 0.0,
    )
    arch = ArchSpec(
        model_type="gpt_neox", num_layers=layers, hidden_size=d, num_heads=heads, num_kv_heads=heads,
        head_dim=hd, intermediate_size=inner, vocab_size=vocab, mlp_kind="gelu", max_positions=positions,
        task=task, num_labels=head_labels(task, labels), layout=layout,
    )
    return ModelShape(
        name=name, architecture=TASK_CLASSES[task], arch=arch, params=params,
        buffers=rotary_buffers("gpt_neox.rotary_emb", frequencies), notes=notes,
    )

