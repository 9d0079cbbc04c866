"""Falcon (``model_type: falcon``) as transformers/models/falcon/modeling_falcon.py builds it.

``transformer.word_embeddings``, ``transformer.h.N``, ``transformer.ln_f``; ``lm_head`` (no bias) tied
to the embedding by default (``FalconConfig.tie_word_embeddings = True``). Each layer:

- ``self_attention.query_key_value``: ``(H + 2 KV) hd`` outputs with ``new_decoder_architecture``
  (Falcon-40B/180B: ``num_kv_heads`` groups), ``d + 2 hd`` with ``multi_query`` (Falcon-7B: one key
  and value head), else ``3 d``; ``self_attention.dense`` ``(d, d)``; biases with ``bias``;
- MLP ``dense_h_to_4h``/``dense_4h_to_h`` of width ``ffn_hidden_size`` (default 4 d);
- LayerNorms (with bias): ``input_layernorm`` + ``post_attention_layernorm`` without
  ``parallel_attn``; ``ln_attn`` + ``ln_mlp`` when ``num_ln_in_parallel_attn`` is 2 (the default
  with ``new_decoder_architecture``); else ``input_layernorm`` alone.

``n_embed`` overrides ``hidden_size`` (``FalconConfig.__post_init__``). Buffers:
``transformer.rotary_emb.inv_freq``/``original_inv_freq`` of ``ceil(hd / 2)`` (registered even
with ``alibi``, which then goes unused).

What changes with the release (``at_release``): transformers 5.25.0 ``configuration_falcon.py``
sets ``num_key_value_heads`` (``num_kv_heads`` with ``new_decoder_architecture`` or without
``multi_query``, else 1), so ``to_dict()`` has it and peft sizes prefix tuning by it; 5.25.0
``modeling_falcon.py`` rewrote ``FalconAttention``: q, k, v split with their own head counts (no
``broadcast_to`` of k, v to every head, no ``_split_heads``/``_merge_heads``), then
``ALL_ATTENTION_FUNCTIONS`` / ``eager_attention_forward`` with ``repeat_kv`` and the fp32 softmax, as
Llama's; ALiBi goes through the mask. Up to 5.24 (``FalconAttention`` with its own sdpa/eager branches,
``FalconFlashAttention2``) the shape is as ``build_falcon`` makes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from memfit.core.families.blocks import embedding, layer_norm, linear, specs, stack
from memfit.core.families.config_fields import divide_heads, read_bool, read_float, read_int
from memfit.core.families.heads import head_labels, decoder_head, num_labels, resolve_task
from memfit.core.families.rope import rope_frequencies, rotary_buffers
from memfit.core.families.validate import check_heads
from memfit.core.model import ArchSpec, LayerLayout, ModelShape
from memfit.core.stack.releases import at_least

TASK_CLASSES = {
    "causal-lm": "FalconForCausalLM",
    "sequence-classification": "FalconForSequenceClassification",
    "token-classification": "FalconForTokenClassification",
    "question-answering": "FalconForQuestionAnswering",
}
ARCHITECTURE = TASK_CLASSES["causal-lm"]

SHARED_ATTENTION_FROM = "5.25"
"""The first transformers release whose ``FalconConfig`` has ``num_key_value_heads`` and whose
``FalconAttention`` calls the shared attention functions (5.25.0 ``models/falcon/``; 5.24.0 has
neither)."""


def build_falcon(name: str, config: Mapping[str, Any], task: str | None = None) -> ModelShape:
    """Parameters and buffers of the Falcon class for ``task``."""
    task, notes = resolve_task("falcon", TASK_CLASSES, "causal-lm", config, task)
    vocab = read_int(config, "vocab_size", default=65024)
    d = read_int(config, "n_embed", "hidden_size", default=4544)
    layers = read_int(config, "num_hidden_layers", "n_layer", default=32)
    heads = read_int(config, "num_attention_heads", "n_head", default=71)
    new_arch = read_bool(config, "new_decoder_architecture", default=False)
    multi_query = read_bool(config, "multi_query", default=True)
    parallel = read_bool(config, "parallel_attn", default=True)
    bias = read_bool(config, "bias", default=False)
    alibi = read_bool(config, "alibi", default=False)
    ffn = read_int(config, "ffn_hidden_size", default=4 * d)
    tied = read_bool(config, "tie_word_embeddings", default=True)
    hd = divide_heads(d, heads)
    configured_kv = read_int(config, "num_kv_heads", default=heads)
    if new_arch:
        kv_heads, qkv = configured_kv, (2 * configured_kv + heads) * hd
    elif multi_query:
        kv_heads, qkv = 1, d + 2 * hd
    else:
        kv_heads, qkv = heads, 3 * d
    check_heads(heads, kv_heads)
    n_ln = config.get("num_ln_in_parallel_attn")
    if n_ln is None and new_arch:
        n_ln = 2
    if not parallel:
        norms = [*layer_norm("post_attention_layernorm", d), *layer_norm("input_layernorm", d)]
    elif n_ln == 2:
        norms = [*layer_norm("ln_attn", d), *layer_norm("ln_mlp", d)]
    else:
        norms = layer_norm("input_layernorm", d)
    labels = num_labels(config)

    block = [
        *linear("self_attention.query_key_value", d, qkv, bias=bias),
        *linear("self_attention.dense", d, d, bias=bias),
        *linear("mlp.dense_h_to_4h", d, ffn, bias=bias),
        *linear("mlp.dense_4h_to_h", ffn, d, bias=bias),
        *norms,
    ]
    params = (
        *specs(embedding("transformer.word_embeddings", vocab, d)),
        *stack("transformer.h", layers, block),
        *specs(layer_norm("transformer.ln_f", d)),
        *specs(decoder_head(task, d=d, vocab=vocab, labels=labels, tied=tied, token_head="classifier")),
    )
    frequencies = rope_frequencies(config, hd)
    layout = LayerLayout(
        family="neox", norm="layer", act="gelu", gated=False, fused_qkv=True,
        parallel=parallel or new_arch, two_norms_parallel=parallel and n_ln == 2,
        rotary_dim=0 if alibi else hd,
        hidden_dropout=read_float(config, "hidden_dropout", default=0.0) or 0.0,
        attention_dropout=read_float(config, "attention_dropout", default=0.0) or 0.0,
        tied_embeddings=tied,
        classifier_dropout=(read_float(config, "classifier_dropout", default=None)
                            if config.get("classifier_dropout") is not None
                            else read_float(config, "hidden_dropout", default=0.0)) or 0.0,
    )
    arch = ArchSpec(
        model_type="falcon", num_layers=layers, hidden_size=d, num_heads=heads, num_kv_heads=kv_heads,
        head_dim=hd, intermediate_size=ffn, vocab_size=vocab, mlp_kind="gelu",
        max_positions=read_int(config, "max_position_embeddings", default=2048),
        task=task, num_labels=head_labels(task, labels), layout=layout,
    )
    return ModelShape(
        name=name, architecture=TASK_CLASSES[task], arch=arch, params=params,
        buffers=rotary_buffers("transformer.rotary_emb", frequencies), notes=notes,
    )


def at_release(shape: ModelShape, line: str | None) -> ModelShape:
    """``shape`` as transformers ``line`` builds it (None: memfit's default release, 5.24): from 5.25
    the config has ``num_key_value_heads`` (``ArchSpec.kv_heads_key``) and the attention is the shared
    one (``LayerLayout.shared_attention``); the parameters and buffers are the same in every release."""
    if line is None or not at_least(line, SHARED_ATTENTION_FROM):
        return shape
    arch = shape.arch
    layout = replace(arch.layout, shared_attention=True) if arch.layout is not None else None
    return replace(shape, arch=replace(arch, kv_heads_key=True, layout=layout))
