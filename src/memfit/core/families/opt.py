"""OPT (``model_type: opt``) as ``OPTForCausalLM`` builds it.

Mirrors transformers/models/opt/modeling_opt.py. ``OPTDecoder`` has ``embed_tokens`` of width
``word_embed_proj_dim`` (default: hidden size), learned positions with an offset of 2
(``OPTLearnedPositionalEmbedding``: ``max_position_embeddings + 2`` rows), ``project_out`` and
``project_in`` (no bias) only when the projection width differs from the hidden size (opt-350m), and
a final LayerNorm only with ``do_layer_norm_before`` and not ``_remove_final_layer_norm``. Each
layer: q/k/v/out projections and ``fc1``/``fc2`` (bias with ``enable_bias``) and two LayerNorms
(no params with ``layer_norm_elementwise_affine: false``). ``lm_head`` (no bias) is tied to
``embed_tokens`` by default.

Per layer: 4 d^2 + 2 d f + 9 d + f, with d = hidden size and f = ffn_dim (defaults).

Buffers: none (positions come from the attention mask at each call).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memfit.core.families.blocks import embedding, layer_norm, linear, specs, stack
from memfit.core.families.config_fields import divide_heads, read_bool, read_int
from memfit.core.families.heads import head_labels, decoder_head, num_labels, resolve_task
from memfit.core.model import ArchSpec, ModelShape

TASK_CLASSES = {
    "causal-lm": "OPTForCausalLM",
    "sequence-classification": "OPTForSequenceClassification",
    "question-answering": "OPTForQuestionAnswering",
}
ARCHITECTURE = TASK_CLASSES["causal-lm"]

_POSITION_OFFSET = 2
"""``OPTLearnedPositionalEmbedding.offset``: fairseq reserves two rows for padding."""


def build_opt(name: str, config: Mapping[str, Any], task: str | None = None) -> ModelShape:
    """Parameters of the OPT class for ``task``, named as ``named_parameters()`` names them."""
    task, notes = resolve_task("opt", TASK_CLASSES, "causal-lm", config, task)
    vocab = read_int(config, "vocab_size", default=50272)
    d = read_int(config, "hidden_size", default=768)
    layers = read_int(config, "num_hidden_layers", default=12)
    heads = read_int(config, "num_attention_heads", default=12)
    ffn = read_int(config, "ffn_dim", default=3072)
    positions = read_int(config, "max_position_embeddings", default=2048)
    proj = read_int(config, "word_embed_proj_dim", default=d)
    bias = read_bool(config, "enable_bias", default=True)
    affine = read_bool(config, "layer_norm_elementwise_affine", default=True)
    final_norm = read_bool(config, "do_layer_norm_before", default=True) and not read_bool(
        config, "_remove_final_layer_norm", default=False
    )
    tied = read_bool(config, "tie_word_embeddings", default=True)

    decoder = [
        *embedding("model.decoder.embed_tokens", vocab, proj),
        *embedding("model.decoder.embed_positions", positions + _POSITION_OFFSET, d),
    ]
    if proj != d:
        decoder += linear("model.decoder.project_out", d, proj, bias=False)
        decoder += linear("model.decoder.project_in", proj, d, bias=False)
    if final_norm:
        decoder += layer_norm("model.decoder.final_layer_norm", d, affine=affine)
    block = [
        *linear("self_attn.k_proj", d, d, bias=bias),
        *linear("self_attn.v_proj", d, d, bias=bias),
        *linear("self_attn.q_proj", d, d, bias=bias),
        *linear("self_attn.out_proj", d, d, bias=bias),
        *layer_norm("self_attn_layer_norm", d, affine=affine),
        *linear("fc1", d, ffn, bias=bias),
        *linear("fc2", ffn, d, bias=bias),
        *layer_norm("final_layer_norm", d, affine=affine),
    ]
    params = (
        *specs(decoder),
        *stack("model.decoder.layers", layers, block),
        *specs(decoder_head(task, d=proj, vocab=vocab, labels=num_labels(config), tied=tied)),
    )
    arch = ArchSpec(
        model_type="opt",
        num_layers=layers,
        hidden_size=d,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=divide_heads(d, heads),
        intermediate_size=ffn,
        vocab_size=vocab,
        mlp_kind="gelu",  # two matrices (fc1, fc2); OPT's activation is ReLU
        max_positions=positions,
        task=task,
        num_labels=head_labels(task, num_labels(config)),
    )
    return ModelShape(name=name, architecture=TASK_CLASSES[task], arch=arch, params=params, notes=notes)
