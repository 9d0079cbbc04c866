"""GPT-J (``model_type: gptj``) as ``GPTJForCausalLM`` builds it; KoGPT 6B is a GPT-J.

Mirrors transformers/models/gptj/modeling_gptj.py: ``GPTJModel`` (``wte``, ``h.N`` blocks, ``ln_f``)
and ``GPTJForCausalLM.lm_head = nn.Linear(n_embd, vocab_size)`` *with* a bias. Rotary embeddings
carry no parameters, and there is no position table. Per block: ``ln_1``, q/k/v/out projections
without bias (``GPTJAttention``), and ``fc_in``/``fc_out`` with bias (``GPTJMLP``). Defaults are
``GPTJConfig``'s; ``tie_word_embeddings`` defaults to false, so ``lm_head.weight`` is its own param.

Per block: 4 d^2 + 2 d i + i + 3 d, with d = n_embd and i = n_inner or 4 d.

Buffers: one, ``transformer.rotary_emb.embed_positions`` (``GPTJRotaryEmbedding``, shared by all
blocks): ``create_sinusoidal_positions(n_positions, r)`` concatenates sin and cos of
``positions x arange(0, r, 2)``, so its shape is ``(n_positions, 2 ceil(r / 2))`` with
``r = rotary_dim`` (``GPTJConfig`` default 64). It is fp32 whatever the load dtype (an fp32
``arange(...).float()`` times the frequencies) and non-persistent. KoGPT: 2048 x 64 x 4 B = 512 KiB.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memfit.core.families.blocks import embedding, layer_norm, linear, specs, stack
from memfit.core.families.config_fields import divide_heads, read_bool, read_int, read_optional_int
from memfit.core.families.heads import head_labels, decoder_head, num_labels, resolve_task
from memfit.core.model import ArchSpec, BufferSpec, ModelShape

TASK_CLASSES = {
    "causal-lm": "GPTJForCausalLM",
    "sequence-classification": "GPTJForSequenceClassification",
    "question-answering": "GPTJForQuestionAnswering",
}
ARCHITECTURE = TASK_CLASSES["causal-lm"]


def _rotary_table(positions: int, rotary_dim: int) -> BufferSpec:
    """``GPTJRotaryEmbedding.embed_positions``: sin and cos of ``ceil(r / 2)`` frequencies."""
    return BufferSpec(
        "transformer.rotary_emb.embed_positions",
        (positions, 2 * ((rotary_dim + 1) // 2)),
        "fp32",
        persistent=False,
    )


def build_gptj(name: str, config: Mapping[str, Any], task: str | None = None) -> ModelShape:
    """Parameters and buffers of the GPT-J class for ``task``, named as torch names them."""
    task, notes = resolve_task("gptj", TASK_CLASSES, "causal-lm", config, task)
    vocab = read_int(config, "vocab_size", default=50400)
    d = read_int(config, "n_embd", "hidden_size", default=4096)
    layers = read_int(config, "n_layer", "num_hidden_layers", default=28)
    heads = read_int(config, "n_head", "num_attention_heads", default=16)
    positions = read_int(config, "n_positions", "max_position_embeddings", default=2048)
    inner = read_optional_int(config, "n_inner") or 4 * d
    tied = read_bool(config, "tie_word_embeddings", default=False)
    rotary_dim = read_int(config, "rotary_dim", default=64)  # GPTJConfig rejects null

    block = [
        *layer_norm("ln_1", d),
        *linear("attn.k_proj", d, d, bias=False),
        *linear("attn.v_proj", d, d, bias=False),
        *linear("attn.q_proj", d, d, bias=False),
        *linear("attn.out_proj", d, d, bias=False),
        *linear("mlp.fc_in", d, inner),
        *linear("mlp.fc_out", inner, d),
    ]
    labels = num_labels(config)
    # tied: lm_head.weight is transformer.wte.weight; the bias stays its own parameter
    head = decoder_head(task, d=d, vocab=vocab, labels=labels, tied=tied, lm_bias=True)
    params = (
        *specs(embedding("transformer.wte", vocab, d)),
        *stack("transformer.h", layers, block),
        *specs(layer_norm("transformer.ln_f", d)),
        *specs(head),
    )
    arch = ArchSpec(
        model_type="gptj",
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
    return ModelShape(
        notes=notes,
        name=name,
        architecture=TASK_CLASSES[task],
        arch=arch,
        params=params,
        buffers=(_rotary_table(positions, rotary_dim),),
    )
