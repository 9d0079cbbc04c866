"""GPT-2 (``model_type: gpt2``) as ``GPT2LMHeadModel`` builds it.

Mirrors transformers/models/gpt2/modeling_gpt2.py: ``wte``, learned positions ``wpe``
(``n_positions x n_embd``), ``h.N`` blocks and ``ln_f``. GPT-2 uses ``Conv1D`` layers whose weight
is stored ``(in, out)``, the transpose of ``nn.Linear``. ``lm_head`` has no bias and is tied to
``wte`` by default (``GPT2Config.tie_word_embeddings = True``), so ``named_parameters`` lists
``transformer.wte.weight`` once and no ``lm_head.weight``. With ``add_cross_attention`` each block
also has ``crossattention`` (``c_attn`` of width 2d plus ``q_attn``) and ``ln_cross_attn``.

Per block: 4 d^2 + 2 d i + i + 9 d, with d = n_embd and i = n_inner or 4 d (no cross-attention).

Buffers: none. transformers 4 registered a causal mask ``attn.bias`` (bool, ``(1, 1, P, P)``) and
``attn.masked_bias`` per block; transformers 5 builds masks per call and ignores those checkpoint
keys (``GPT2PreTrainedModel._keys_to_ignore_on_load_unexpected``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memfit.core.families.blocks import conv1d, embedding, layer_norm, linear, specs, stack
from memfit.core.families.config_fields import divide_heads, read_bool, read_int, read_optional_int
from memfit.core.families.heads import head_labels, decoder_head, num_labels, resolve_task
from memfit.core.model import ArchSpec, ModelShape

TASK_CLASSES = {
    "causal-lm": "GPT2LMHeadModel",
    "sequence-classification": "GPT2ForSequenceClassification",
    "token-classification": "GPT2ForTokenClassification",
    "question-answering": "GPT2ForQuestionAnswering",
}
ARCHITECTURE = TASK_CLASSES["causal-lm"]


def build_gpt2(name: str, config: Mapping[str, Any], task: str | None = None) -> ModelShape:
    """Parameters of the GPT-2 class for ``task``, named as ``named_parameters()`` names them."""
    task, notes = resolve_task("gpt2", TASK_CLASSES, "causal-lm", config, task)
    vocab = read_int(config, "vocab_size", default=50257)
    d = read_int(config, "n_embd", "hidden_size", default=768)
    layers = read_int(config, "n_layer", "num_hidden_layers", default=12)
    heads = read_int(config, "n_head", "num_attention_heads", default=12)
    positions = read_int(config, "n_positions", "max_position_embeddings", default=1024)
    inner = read_optional_int(config, "n_inner") or 4 * d
    tied = read_bool(config, "tie_word_embeddings", default=True)
    cross = read_bool(config, "add_cross_attention", default=False)
    labels = num_labels(config)

    block = [
        *layer_norm("ln_1", d),
        *conv1d("attn.c_attn", d, 3 * d),
        *conv1d("attn.c_proj", d, d),
        *layer_norm("ln_2", d),
    ]
    if cross:
        block += [
            *conv1d("crossattention.c_attn", d, 2 * d),
            *conv1d("crossattention.q_attn", d, d),
            *conv1d("crossattention.c_proj", d, d),
            *layer_norm("ln_cross_attn", d),
        ]
    block += [*conv1d("mlp.c_fc", d, inner), *conv1d("mlp.c_proj", inner, d)]
    params = (
        *specs(embedding("transformer.wte", vocab, d)),
        *specs(embedding("transformer.wpe", positions, d)),
        *stack("transformer.h", layers, block),
        *specs(layer_norm("transformer.ln_f", d)),
        *specs(decoder_head(task, d=d, vocab=vocab, labels=labels, tied=tied, token_head="classifier")),
    )
    arch = ArchSpec(
        model_type="gpt2",
        num_layers=layers,
        hidden_size=d,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=divide_heads(d, heads),
        intermediate_size=inner,
        vocab_size=vocab,
        mlp_kind="gelu",
        max_positions=positions,
        task=task,
        num_labels=head_labels(task, labels),
    )
    return ModelShape(name=name, architecture=TASK_CLASSES[task], arch=arch, params=params, notes=notes)
