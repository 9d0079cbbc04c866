"""Llama-style decoders: one layout, many families.

``model.embed_tokens``, ``model.layers.N`` (attention, MLP, RMSNorms), ``model.norm`` and a head
(``lm_head`` without bias, tied to the embedding when ``tie_word_embeddings``), as
transformers/models/llama/modeling_llama.py and the modular copies of it build them. What differs
per family (``_VARIANTS``), each mirrored from its own modeling file:

- biases: Llama ``attention_bias`` (q, k, v, o) and ``mlp_bias``; Qwen2 q, k, v always, o never;
  Qwen2-MoE ``qkv_bias``; Qwen3, Gemma, OLMo2, Llama 4 ``attention_bias``; Mistral, Mixtral, Phi-3 none;
- q/k norms: Qwen3, Qwen3-MoE, Gemma 3 ``self_attn.q_norm``/``k_norm`` over ``head_dim``; OLMo2
  over the whole projection (``H hd`` and ``KV hd``); Llama 4 a parameter-free L2 norm;
- norms: ``input_layernorm`` + ``post_attention_layernorm``; Gemma 2/3 add
  ``pre_feedforward_layernorm`` and ``post_feedforward_layernorm``; OLMo2 has
  ``post_attention_layernorm`` and ``post_feedforward_layernorm`` only;
- Phi-3 fuses ``self_attn.qkv_proj`` ``((H + 2 KV) hd, d)`` and ``mlp.gate_up_proj`` ``(2 i, d)``;
- DeepSeek-V3 multi-head latent attention (``_mla``); experts (``memfit.core.families.moe``) in
  Mixtral, Qwen2/3-MoE, DeepSeek-V3, Llama 4;
- Gemma's embedding scale is a buffer, ``model.embed_tokens.embed_scale`` (0-d, fp32, not saved).

Attention: q ``(H hd, d)``, k and v ``(KV hd, d)``, o ``(d, H hd)`` with ``hd = head_dim`` (the config
class default where absent: 128 for Qwen3 and Llama 4, 256 for Gemma, else ``d / H``).

Buffers: ``model.rotary_emb.inv_freq``/``original_inv_freq`` (``memfit.core.families.rope``), per
layer type for Gemma 3 (``{sliding,full}_attention_inv_freq``); DeepSeek's router bias.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import Any

from memfit.core.lean_dataclass import dataclass
from memfit.core.families import moe as moe_mod
from memfit.core.families.blocks import Entry, embedding, linear, prefixed, rms_norm, specs, stack, stack_layers
from memfit.core.families.config_fields import divide_heads, read_bool, read_float, read_int
from memfit.core.families.heads import decoder_head, num_labels, resolve_task
from memfit.core.families.rope import rope_dict, rope_frequencies, rotary_buffers
from memfit.core.families.validate import check_heads
from memfit.core.model import ArchSpec, BufferSpec, LayerLayout, ModelShape
from memfit.errors import MemfitError


@dataclass(frozen=True, slots=True, kw_only=True)
class _Variant:
    """One family: its config-class defaults and how its layers differ from Llama's."""

    prefix: str
    """Class-name prefix (``Qwen2Moe``)."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None
    """None: equal to ``num_attention_heads``."""
    max_position_embeddings: int
    head_dim: int | None = None
    """Config-class default head_dim (None: ``hidden_size / heads``)."""
    tasks: tuple[str, ...] = ("causal-lm", "sequence-classification", "token-classification", "question-answering")
    qa_base: str = "model"
    """Attribute holding the backbone in ``<Prefix>ForQuestionAnswering``."""
    bias: str = "none"
    """``llama``, ``qwen2``, ``qkv_bias``, ``attention_bias`` or ``none``."""
    qk_norm: str = ""
    norms: str = "pre"
    fused: bool = False
    moe: bool = False
    mla: bool = False
    embed_scale: bool = False
    tied: bool = False
    act: str = "silu"
    gemma_norm: bool = False
    rope_partial: bool = False
    task_classes: Mapping[str, str] = field(default_factory=dict)


def _v(prefix: str, **kw: Any) -> _Variant:
    variant = _Variant(prefix=prefix, **kw)
    suffix = {"causal-lm": "ForCausalLM", "sequence-classification": "ForSequenceClassification",
              "token-classification": "ForTokenClassification", "question-answering": "ForQuestionAnswering"}
    classes = {task: f"{prefix}{suffix[task]}" for task in variant.tasks}
    object.__setattr__(variant, "task_classes", classes)
    return variant


_ALL = ("causal-lm", "sequence-classification", "token-classification", "question-answering")
_NO_QA = ("causal-lm", "sequence-classification", "token-classification")

# Defaults: each config class's (transformers 5 configuration_<family>.py).
_VARIANTS: dict[str, _Variant] = {
    "llama": _v("Llama", vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=None, max_position_embeddings=2048,
                bias="llama", qa_base="transformer"),
    "mistral": _v("Mistral", vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096 * 32),
    "mixtral": _v("Mixtral", vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096 * 32, moe=True),
    "qwen2": _v("Qwen2", vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=None, max_position_embeddings=32768,
                bias="qwen2", qa_base="transformer"),
    "qwen3": _v("Qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=None, max_position_embeddings=32768, head_dim=128,
                bias="attention_bias", qk_norm="head", qa_base="transformer"),
    "qwen2_moe": _v("Qwen2Moe", vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                    num_attention_heads=16, num_key_value_heads=None, max_position_embeddings=32768,
                    bias="qkv_bias", moe=True),
    "qwen3_moe": _v("Qwen3Moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
                    num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=32768,
                    bias="attention_bias", qk_norm="head", moe=True, qa_base="transformer"),
    "gemma": _v("Gemma", vocab_size=256000, hidden_size=3072, intermediate_size=24576, num_hidden_layers=28,
                num_attention_heads=16, num_key_value_heads=None, max_position_embeddings=8192, head_dim=256,
                bias="attention_bias", embed_scale=True, tied=True, act="gelu_tanh", gemma_norm=True, tasks=_NO_QA),
    "gemma2": _v("Gemma2", vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                 num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=8192, head_dim=256,
                 bias="attention_bias", norms="sandwich", embed_scale=True, tied=True, act="gelu_tanh",
                 gemma_norm=True, tasks=_NO_QA),
    "gemma3_text": _v("Gemma3", vocab_size=262208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=131072, head_dim=256,
                      bias="attention_bias", qk_norm="head", norms="sandwich", embed_scale=True, tied=True,
                      act="gelu_tanh", gemma_norm=True, tasks=("causal-lm", "sequence-classification")),
    "phi3": _v("Phi3", vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=None, max_position_embeddings=4096, fused=True,
               rope_partial=True, tasks=_NO_QA),
    "olmo2": _v("Olmo2", vocab_size=50304, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=None, max_position_embeddings=2048,
                bias="attention_bias", qk_norm="full", norms="post", tasks=("causal-lm", "sequence-classification")),
    "deepseek_v3": _v("DeepseekV3", vocab_size=129280, hidden_size=7168, intermediate_size=18432,
                      num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128,
                      max_position_embeddings=4096, moe=True, mla=True, tasks=_NO_QA),
    "llama4_text": _v("Llama4", vocab_size=202048, hidden_size=5120, intermediate_size=8192, num_hidden_layers=48,
                      num_attention_heads=40, num_key_value_heads=8, max_position_embeddings=4096 * 32,
                      head_dim=128, bias="attention_bias", qk_norm="l2", moe=True, tasks=("causal-lm",)),
}

MODEL_TYPES = tuple(_VARIANTS)
TASK_CLASSES: Mapping[str, Mapping[str, str]] = {mt: v.task_classes for mt, v in _VARIANTS.items()}
"""model_type -> task -> transformers class (a copy of transformers' auto mappings; tested)."""

_GEMMA3_CLASSES = {"causal-lm": "Gemma3ForCausalLM", "sequence-classification": "Gemma3TextForSequenceClassification"}
TASK_CLASSES = {**TASK_CLASSES, "gemma3_text": _GEMMA3_CLASSES}

DEFAULT_TASK = "causal-lm"

_ACTS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
         "gelu": "gelu", "relu": "relu"}


def _biases(variant: _Variant, config: Mapping[str, Any]) -> tuple[bool, bool, bool]:
    """(q/k/v bias, o bias, MLP bias)."""
    if variant.bias == "llama":
        attn = read_bool(config, "attention_bias", default=False)
        return attn, attn, read_bool(config, "mlp_bias", default=False)
    if variant.bias == "qwen2":
        return True, False, False
    if variant.bias == "qkv_bias":
        return read_bool(config, "qkv_bias", default=True), False, False
    if variant.bias == "attention_bias":
        attn = read_bool(config, "attention_bias", default=False)
        return attn, attn, False
    return False, False, False


def _attention(variant: _Variant, config: Mapping[str, Any], d: int, q: int, kv: int, hd: int) -> list[Entry]:
    """The attention block's parameters (relative to the layer)."""
    qkv_bias, o_bias, _ = _biases(variant, config)
    if variant.fused:
        return [*linear("self_attn.o_proj", q, d, bias=False), *linear("self_attn.qkv_proj", d, q + 2 * kv, bias=False)]
    entries = [
        *linear("self_attn.q_proj", d, q, bias=qkv_bias),
        *linear("self_attn.k_proj", d, kv, bias=qkv_bias),
        *linear("self_attn.v_proj", d, kv, bias=qkv_bias),
        *linear("self_attn.o_proj", q, d, bias=o_bias),
    ]
    if variant.qk_norm == "head":
        entries += [*rms_norm("self_attn.q_norm", hd), *rms_norm("self_attn.k_norm", hd)]
    elif variant.qk_norm == "full":
        entries += [*rms_norm("self_attn.q_norm", q), *rms_norm("self_attn.k_norm", kv)]
    return entries


def _mla(config: Mapping[str, Any], d: int, heads: int) -> tuple[list[Entry], tuple[int, int, int, int, int]]:
    """DeepSeek-V3 multi-head latent attention (modeling_deepseek_v3.DeepseekV3Attention)."""
    q_rank = config.get("q_lora_rank", 1536)
    if q_rank is not None:
        q_rank = read_int(config, "q_lora_rank", default=1536)
    kv_rank = read_int(config, "kv_lora_rank", default=512)
    rope = read_int(config, "qk_rope_head_dim", default=64)
    nope = read_int(config, "qk_nope_head_dim", default=128)
    v = read_int(config, "v_head_dim", default=128)
    bias = read_bool(config, "attention_bias", default=False)
    qk = nope + rope
    if q_rank is None:
        entries = linear("self_attn.q_proj", d, heads * qk, bias=False)
    else:
        entries = [
            *linear("self_attn.q_a_proj", d, q_rank, bias=bias),
            *rms_norm("self_attn.q_a_layernorm", q_rank),
            *linear("self_attn.q_b_proj", q_rank, heads * qk, bias=False),
        ]
    entries += [
        *linear("self_attn.kv_a_proj_with_mqa", d, kv_rank + rope, bias=bias),
        *rms_norm("self_attn.kv_a_layernorm", kv_rank),
        *linear("self_attn.kv_b_proj", kv_rank, heads * (nope + v), bias=False),
        *linear("self_attn.o_proj", heads * v, d, bias=bias),
    ]
    return entries, (q_rank or 0, kv_rank, nope, rope, v)


def _norms(variant: _Variant, d: int) -> list[Entry]:
    names = {
        "pre": ("input_layernorm", "post_attention_layernorm"),
        "sandwich": ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"),
        "post": ("post_attention_layernorm", "post_feedforward_layernorm"),
    }[variant.norms]
    return [entry for name in names for entry in rms_norm(name, d)]


def _dense_mlp(variant: _Variant, config: Mapping[str, Any], d: int, i: int) -> list[Entry]:
    if variant.fused:
        return [*linear("mlp.gate_up_proj", d, 2 * i, bias=False), *linear("mlp.down_proj", i, d, bias=False)]
    return moe_mod.swiglu("mlp", d, i, bias=_biases(variant, config)[2])


def _act(variant: _Variant, config: Mapping[str, Any]) -> str:
    name = config.get("hidden_activation") or config.get("hidden_act") if variant.gemma_norm else config.get("hidden_act")
    if name is None:
        return variant.act
    if not isinstance(name, str) or name not in _ACTS:
        raise MemfitError(f"config.json hidden_act {name!r} is not one memfit models ({', '.join(_ACTS)})")
    return _ACTS[name]


def _buffers(model_type: str, variant: _Variant, config: Mapping[str, Any], hd: int, layers: int,
             moe: moe_mod.MoeLayout | None) -> tuple[BufferSpec, ...]:
    buffers: list[BufferSpec] = []
    if variant.embed_scale:
        # torch.tensor(sqrt(hidden)) takes the default dtype, which from_pretrained sets to the load dtype
        buffers.append(BufferSpec("model.embed_tokens.embed_scale", (), "fp32", persistent=False,
                                  follows_load_dtype=True))
    if moe is not None and moe.router_buffer:  # layers come before model.rotary_emb in named_buffers
        buffers += [
            BufferSpec(f"model.layers.{i}.mlp.gate.e_score_correction_bias", (moe.experts,), "fp32", persistent=True)
            for i, has in enumerate(moe.moe_layers) if has
        ]
    if model_type == "gemma3_text":
        rope = config.get("rope_parameters") or {}
        scaling = config.get("rope_scaling")
        for layer_type in sorted(set(_gemma3_layer_types(config, layers))):
            params = dict(rope.get(layer_type) or {}) if isinstance(rope, Mapping) and layer_type in rope else {}
            if layer_type == "full_attention" and isinstance(scaling, Mapping):
                params.update(scaling)
            n = rope_frequencies(config, hd, rope=params)
            buffers += rotary_buffers("model.rotary_emb", n, tag=f"{layer_type}_")
    else:
        rope_hd = read_int(config, "qk_rope_head_dim", default=64) if variant.mla else hd
        buffers += rotary_buffers("model.rotary_emb", rope_frequencies(config, rope_hd, default_partial=variant.rope_partial))
    return tuple(buffers)


def _first_float(config: Mapping[str, Any], *keys: str, default: float) -> float:
    """The first of ``keys`` the config sets (GenericForTokenClassification's dropout rule)."""
    for key in keys:
        value = read_float(config, key, default=None)
        if value is not None:
            return value
    return default


def _gemma3_layer_types(config: Mapping[str, Any], layers: int) -> list[str]:
    types = config.get("layer_types")
    if types is not None:
        if not isinstance(types, list | tuple) or len(types) != layers or not all(
            t in ("sliding_attention", "full_attention") for t in types
        ):
            raise MemfitError("config.json layer_types must list sliding_attention/full_attention once per layer")
        return list(types)
    pattern = read_int(config, "sliding_window_pattern", default=6)
    return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]


def build_llama_like(name: str, config: Mapping[str, Any], task: str | None = None) -> ModelShape:
    """Parameters and buffers of the class ``task`` names for a Llama-style ``model_type``."""
    model_type = config["model_type"]
    v = _VARIANTS[model_type]
    classes = TASK_CLASSES[model_type]
    task, notes = resolve_task(model_type, classes, DEFAULT_TASK, config, task)
    vocab = read_int(config, "vocab_size", default=v.vocab_size)
    d = read_int(config, "hidden_size", default=v.hidden_size)
    i = read_int(config, "intermediate_size", default=v.intermediate_size)
    layers = read_int(config, "num_hidden_layers", default=v.num_hidden_layers)
    heads = read_int(config, "num_attention_heads", default=v.num_attention_heads)
    kv_heads = read_int(config, "num_key_value_heads", default=v.num_key_value_heads or heads)
    check_heads(heads, kv_heads)
    hd = read_int(config, "head_dim", default=v.head_dim or divide_heads(d, heads))
    positions = read_int(config, "max_position_embeddings", default=v.max_position_embeddings)
    tied = read_bool(config, "tie_word_embeddings", default=v.tied)
    labels = num_labels(config)
    rope_dict(config)

    moe = moe_mod.read_moe(model_type, config, layers, i) if v.moe else None
    if v.mla:
        attention, mla = _mla(config, d, heads)
    else:
        attention, mla = _attention(v, config, d, heads * hd, kv_heads * hd, hd), ()
    norms = _norms(v, d)
    if moe is None:
        params_layers = stack("model.layers", layers, [*attention, *_dense_mlp(v, config, d, i), *norms])
    else:
        moe_block = [*attention, *moe_mod.moe_block(model_type, moe, d), *norms]
        dense = [*attention, *moe_mod.dense_block(model_type, moe, d), *norms]
        if all(moe.moe_layers):
            params_layers = stack("model.layers", layers, moe_block)
        else:
            params_layers = stack_layers("model.layers", [moe_block if m else dense for m in moe.moe_layers])
    base = v.qa_base if task == "question-answering" else "model"
    if base != "model":
        params_layers = [type(p)(base + p.name[len("model"):], p.shape) for p in params_layers]
    params = (
        *specs(embedding(f"{base}.embed_tokens", vocab, d)),
        *params_layers,
        *specs(rms_norm(f"{base}.norm", d)),
        *specs(decoder_head(task, d=d, vocab=vocab, labels=labels, tied=tied)),
    )
    buffers = _buffers(model_type, v, config, hd, layers, moe)
    if base != "model":
        buffers = tuple(type(b)(base + b.name[len("model"):], b.shape, b.dtype, b.persistent, b.follows_load_dtype)
                        for b in buffers)
    sliding = 0
    window = read_int(config, "sliding_window", default=0, minimum=0) if "sliding_window" in config else 0
    if model_type == "gemma3_text":
        sliding = _gemma3_layer_types(config, layers).count("sliding_attention")
    elif model_type == "gemma2":
        sliding = (layers + 1) // 2
        window = read_int(config, "sliding_window", default=4096)
    elif window and read_bool(config, "use_sliding_window", default=model_type in ("mistral", "mixtral", "phi3")):
        sliding = layers
    kinds = []
    gemma3_types = _gemma3_layer_types(config, layers) if model_type == "gemma3_text" else ()
    interval = read_int(config, "no_rope_layer_interval", default=4) if model_type == "llama4_text" else 0
    for index in range(layers):
        kind = "m" if moe is not None and moe.moe_layers[index] else "d"
        sliding_here = (gemma3_types[index] == "sliding_attention") if gemma3_types else (
            sliding == layers or (model_type == "gemma2" and index % 2 == 0))
        kind += "s" if sliding_here and sliding else ""
        kind += "n" if interval and (index + 1) % interval == 0 else ""
        kinds.append(kind)
    layout = LayerLayout(
        layer_kinds=tuple(kinds),
        family="llama",
        norm="rms_gemma" if v.gemma_norm else ("rms_olmo2" if model_type == "olmo2" else "rms"),
        rotary_fp32=model_type == "olmo2",
        eager_softmax_fp32=model_type != "llama4_text",
        rotary_keeps_dtype=model_type in ("olmo2", "llama4_text"),
        act=_act(v, config),
        qk_norm=v.qk_norm,
        norms=v.norms,
        fused_qkv=v.fused,
        fused_gate_up=v.fused,
        rotary_dim=hd if not mla else mla[3],
        embed_scale=v.embed_scale,
        logit_softcap=read_float(config, "final_logit_softcapping", default=30.0 if model_type == "gemma2" else 0.0) or 0.0,
        attn_softcap=read_float(config, "attn_logit_softcapping", default=50.0 if model_type == "gemma2" else 0.0) or 0.0,
        dense_layers=0 if moe is None else moe.moe_layers.count(False),
        dense_intermediate_size=0 if moe is None else moe.dense_size,
        shared_expert_size=0 if moe is None else moe.shared_size,
        shared_expert_gate=bool(moe and moe.shared_gate),
        router_renorm=model_type == "mixtral" or (model_type in ("qwen2_moe", "qwen3_moe")
                                                  and read_bool(config, "norm_topk_prob", default=False)),
        moe_kind="" if moe is None else ("llama4" if model_type == "llama4_text" else "grouped"),
        mla=mla,
        attention_dropout=read_float(config, "attention_dropout", default=0.0) or 0.0,
        tied_embeddings=tied,
        classifier_dropout=_first_float(config, "classifier_dropout", "hidden_dropout", default=0.1),
        sliding_layers=sliding,
        sliding_window=window,
    )
    arch = ArchSpec(
        model_type=model_type,
        num_layers=layers,
        hidden_size=d,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=hd,
        intermediate_size=i if moe is None else moe.expert_size,
        vocab_size=vocab,
        mlp_kind="gated",
        num_experts=1 if moe is None else max(moe.experts, 1),
        experts_per_token=1 if moe is None else moe.top_k,
        max_positions=positions,
        task=task,
        num_labels=labels if task in ("sequence-classification", "token-classification") else (2 if task == "question-answering" else 0),
        layout=layout,
    )
    return ModelShape(name=name, architecture=classes[task], arch=arch, params=params, buffers=buffers,
                      notes=notes)
