"""Llama-style decoders: ``llama``, ``mistral``, ``mixtral`` and ``qwen2``.

They share one layout (transformers/models/llama/modeling_llama.py and the modular copies in
mistral/, mixtral/, qwen2/): ``model.embed_tokens``, ``model.layers.N`` with RMSNorm
``input_layernorm`` and ``post_attention_layernorm``, ``model.norm`` and an ``lm_head`` without
bias (its own parameter unless ``tie_word_embeddings``). Rotary embeddings carry no parameters.

Attention (grouped-query): q ``(H hd, d)``, k and v ``(KV hd, d)``, o ``(d, H hd)`` with
``hd = head_dim or d / H``. Biases: Llama's ``attention_bias`` (all four) and ``mlp_bias``;
Qwen2 always biases q, k, v and never o; Mistral and Mixtral have none.

MLP: SwiGLU ``gate_proj``/``up_proj`` ``(i, d)`` and ``down_proj`` ``(d, i)``. Mixtral replaces it
by ``MixtralSparseMoeBlock``: a router ``mlp.gate.weight`` ``(E, d)`` and, in transformers 5, the
experts fused into two 3-D parameters ``mlp.experts.gate_up_proj`` ``(E, 2 i, d)`` and
``mlp.experts.down_proj`` ``(E, d, i)`` (modeling_mixtral.MixtralExperts).

Buffers: ``<Family>RotaryEmbedding`` (one per model, ``model.rotary_emb``) registers ``inv_freq``
and ``original_inv_freq``, both non-persistent fp32 vectors of ``ceil(r / 2)`` frequencies
(``arange(0, r, 2, dtype=torch.float)``): ``r = head_dim`` for the default RoPE
(``compute_default_rope_parameters`` ignores ``partial_rotary_factor``) and
``r = int(head_dim x partial_rotary_factor)`` for the scaled types of
transformers/modeling_rope_utils.py (``linear``, ``dynamic``, ``yarn``, ``longrope``, ``llama3``);
``proportional`` pads to ``head_dim // 2``. Llama-3-70B: 2 x 64 x 4 B = 512 B.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memfit.core.families.blocks import Entry, embedding, linear, rms_norm, specs, stack
from memfit.core.families.config_fields import divide_heads, read_bool, read_int
from memfit.core.model import ArchSpec, BufferSpec, ModelShape
from memfit.errors import MemfitError


@dataclass(frozen=True, slots=True, kw_only=True)
class _Defaults:
    """A config class's defaults for the fields that set shapes."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None
    """None: equal to ``num_attention_heads``."""
    max_position_embeddings: int


_DEFAULTS: dict[str, _Defaults] = {
    # LlamaConfig
    "llama": _Defaults(
        architecture="LlamaForCausalLM", vocab_size=32000, hidden_size=4096,
        intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=None, max_position_embeddings=2048,
    ),
    # MistralConfig
    "mistral": _Defaults(
        architecture="MistralForCausalLM", vocab_size=32000, hidden_size=4096,
        intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=4096 * 32,
    ),
    # MixtralConfig
    "mixtral": _Defaults(
        architecture="MixtralForCausalLM", vocab_size=32000, hidden_size=4096,
        intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=4096 * 32,
    ),
    # Qwen2Config
    "qwen2": _Defaults(
        architecture="Qwen2ForCausalLM", vocab_size=151936, hidden_size=4096,
        intermediate_size=22016, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, max_position_embeddings=32768,
    ),
}

ARCHITECTURES = {model_type: d.architecture for model_type, d in _DEFAULTS.items()}


def _attention(model_type: str, config: Mapping[str, Any], d: int, q: int, kv: int) -> list[Entry]:
    """q/k/v/o projections of ``<Family>Attention`` with that family's biases."""
    if model_type == "llama":
        qkv_bias = o_bias = read_bool(config, "attention_bias", default=False)
    elif model_type == "qwen2":
        qkv_bias, o_bias = True, False
    else:
        qkv_bias = o_bias = False
    return [
        *linear("self_attn.q_proj", d, q, bias=qkv_bias),
        *linear("self_attn.k_proj", d, kv, bias=qkv_bias),
        *linear("self_attn.v_proj", d, kv, bias=qkv_bias),
        *linear("self_attn.o_proj", q, d, bias=o_bias),
    ]


def _mlp(model_type: str, config: Mapping[str, Any], d: int, i: int, experts: int) -> list[Entry]:
    """SwiGLU MLP, or Mixtral's router plus fused experts."""
    if model_type == "mixtral":
        return [
            ("mlp.gate.weight", (experts, d)),
            ("mlp.experts.gate_up_proj", (experts, 2 * i, d)),
            ("mlp.experts.down_proj", (experts, d, i)),
        ]
    bias = model_type == "llama" and read_bool(config, "mlp_bias", default=False)
    return [
        *linear("mlp.gate_proj", d, i, bias=bias),
        *linear("mlp.up_proj", d, i, bias=bias),
        *linear("mlp.down_proj", i, d, bias=bias),
    ]


_SCALED_ROPE_TYPES = ("linear", "dynamic", "yarn", "longrope", "llama3")
"""``ROPE_INIT_FUNCTIONS`` entries whose frequency count is ``ceil(int(head_dim x factor) / 2)``."""


def _rope_parameters(config: Mapping[str, Any]) -> tuple[str, float]:
    """``(rope_type, partial_rotary_factor)`` as ``convert_rope_params_to_dict`` resolves them.

    The dict is ``rope_scaling`` (transformers 4 configs) or ``rope_parameters`` (transformers 5);
    its own ``partial_rotary_factor`` wins over a top-level one; the type is ``rope_type`` or the
    legacy ``type``, ``default`` without either.
    """
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if not isinstance(rope, Mapping):
        raise MemfitError(f"config.json field 'rope_scaling' must be an object, got {rope!r}")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    factor = rope.get("partial_rotary_factor", config.get("partial_rotary_factor"))
    factor = 1.0 if factor is None else factor
    if isinstance(factor, bool) or not isinstance(factor, int | float) or factor <= 0:
        raise MemfitError(f"config.json partial_rotary_factor must be positive, got {factor!r}")
    return rope_type, float(factor)


def _rotary_buffers(config: Mapping[str, Any], head_dim: int) -> tuple[BufferSpec, ...]:
    """``model.rotary_emb.inv_freq`` and ``original_inv_freq`` (same shape, fp32, not saved)."""
    rope_type, factor = _rope_parameters(config)
    if rope_type == "default":
        frequencies = (head_dim + 1) // 2
    elif rope_type in _SCALED_ROPE_TYPES:
        frequencies = (int(head_dim * factor) + 1) // 2
    elif rope_type == "proportional":  # rotated angles, then zeros up to head_dim // 2
        frequencies = max(int(factor * head_dim // 2), head_dim // 2)
    else:
        known = ", ".join(("default", *_SCALED_ROPE_TYPES, "proportional"))
        raise MemfitError(f"config.json rope_type {rope_type!r} is not one of {known}")
    return tuple(
        BufferSpec(f"model.rotary_emb.{name}", (frequencies,), "fp32", persistent=False)
        for name in ("inv_freq", "original_inv_freq")
    )


def build_llama_like(name: str, config: Mapping[str, Any]) -> ModelShape:
    """Parameters and buffers of ``{Llama,Mistral,Mixtral,Qwen2}ForCausalLM(config)``."""
    model_type = config["model_type"]
    defaults = _DEFAULTS[model_type]
    vocab = read_int(config, "vocab_size", default=defaults.vocab_size)
    d = read_int(config, "hidden_size", default=defaults.hidden_size)
    i = read_int(config, "intermediate_size", default=defaults.intermediate_size)
    layers = read_int(config, "num_hidden_layers", default=defaults.num_hidden_layers)
    heads = read_int(config, "num_attention_heads", default=defaults.num_attention_heads)
    kv_default = defaults.num_key_value_heads or heads
    kv_heads = read_int(config, "num_key_value_heads", default=kv_default)
    head_dim = read_int(config, "head_dim", default=divide_heads(d, heads))
    positions = read_int(
        config, "max_position_embeddings", default=defaults.max_position_embeddings
    )
    tied = read_bool(config, "tie_word_embeddings", default=False)
    experts, top_k = 1, 1
    if model_type == "mixtral":
        experts = read_int(config, "num_local_experts", "num_experts", default=8)
        top_k = read_int(config, "num_experts_per_tok", default=2)

    block = [
        *_attention(model_type, config, d, heads * head_dim, kv_heads * head_dim),
        *_mlp(model_type, config, d, i, experts),
        *rms_norm("input_layernorm", d),
        *rms_norm("post_attention_layernorm", d),
    ]
    params = (
        *specs(embedding("model.embed_tokens", vocab, d)),
        *stack("model.layers", layers, block),
        *specs(rms_norm("model.norm", d)),
        *([] if tied else specs(linear("lm_head", d, vocab, bias=False))),
    )
    arch = ArchSpec(
        model_type=model_type,
        num_layers=layers,
        hidden_size=d,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=i,
        vocab_size=vocab,
        mlp_kind="gated",
        num_experts=experts,
        experts_per_token=top_k,
        max_positions=positions,
    )
    return ModelShape(
        name=name,
        architecture=defaults.architecture,
        arch=arch,
        params=params,
        buffers=_rotary_buffers(config, head_dim),
    )
