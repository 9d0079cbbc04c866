"""Typed description of a model's parameters and architecture, built from a config alone.

Glossary:
- *param*: one ``nn.Parameter`` as ``model.named_parameters()`` yields it (tied weights once).
- *numel*: number of elements of a param; bytes come from numel times a dtype size elsewhere.
- *trainable*: ``requires_grad=True`` and handed to the optimizer.
- *buffer*: one tensor as ``model.named_buffers()`` yields it (rotary tables, position ids): never
  trained, held in full by every rank ("Buffers are never ZeRO-partitioned",
  ``DeepSpeedEngine._cast_module_mixed_precision``); *non-persistent* buffers are not in the state
  dict, so ``from_pretrained`` rebuilds them instead of loading them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import field, replace
from types import MappingProxyType
from typing import Any

from memfit.core.lean_dataclass import dataclass


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """One parameter, named exactly as ``model.named_parameters()`` names it."""

    name: str
    """Dotted name, e.g. ``transformer.h.0.attn.q_proj.weight``."""
    shape: tuple[int, ...]
    """Tensor shape."""
    trainable: bool = True
    """``requires_grad`` after the PEFT method is applied."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


BUFFER_DTYPE_BYTES: Mapping[str, int] = MappingProxyType(
    {
        "fp64": 8, "fp32": 4, "fp16": 2, "bf16": 2,
        "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
        "complex64": 8, "complex128": 16,
    }
)
"""Element size of each dtype a buffer can have (``torch.dtype.itemsize``), by memfit's name."""

FLOATING_BUFFER_DTYPES = frozenset({"fp64", "fp32", "fp16", "bf16"})
"""Dtypes that ``module.to(dtype)``/``.half()`` cast and DeepSpeed's ``data_types.buffer_dtype``
casts (``CASTABLE_DTYPES`` in deepspeed/runtime/engine.py); integer and bool buffers keep theirs."""


@dataclass(frozen=True, slots=True)
class BufferSpec:
    """One buffer, named exactly as ``model.named_buffers()`` names it (shared buffers once).

    ``nbytes = numel x BUFFER_DTYPE_BYTES[dtype]``; ``dtype`` is the one transformers creates it
    with under the default dtype fp32.
    """

    name: str
    """Dotted name, e.g. ``transformer.rotary_emb.embed_positions``."""
    shape: tuple[int, ...]
    dtype: str
    """One of ``BUFFER_DTYPE_BYTES`` (``fp32``, ``int64`` ...)."""
    persistent: bool
    """In ``state_dict()`` (saved and loaded); False for ``nn.Buffer(..., persistent=False)``."""
    follows_load_dtype: bool = False
    """True if ``from_pretrained(dtype=fp16)`` creates it in fp16 rather than in ``dtype``.

    Only Gemma's ``embed_scale`` does (``torch.tensor(hidden ** 0.5)`` takes the default dtype,
    which ``from_pretrained(dtype=...)`` sets); transformers 5 builds rotary tables with an explicit
    ``dtype=torch.float``/``.float()`` and position ids as int64. An explicit cast of the whole
    module (``model.half()``, ``model.to(dtype)``) still casts every floating buffer.
    """

    def __post_init__(self) -> None:
        if self.dtype not in BUFFER_DTYPE_BYTES:  # a builder bug, not user input
            raise ValueError(f"buffer {self.name}: unknown dtype {self.dtype!r}")

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * BUFFER_DTYPE_BYTES[self.dtype]

    @property
    def is_floating(self) -> bool:
        """Cast by ``module.to(dtype)`` and by DeepSpeed's ``buffer_dtype`` (see FLOATING_...)."""
        return self.dtype in FLOATING_BUFFER_DTYPES


@dataclass(frozen=True, slots=True)
class ArchSpec:
    """Architecture numbers that activation and compute estimates need (not parameter counts)."""

    model_type: str
    """``model_type`` from config.json (``gptj``, ``llama``, ...)."""
    num_layers: int
    """Transformer blocks (decoder blocks for encoder-decoder models; see ``num_encoder_layers``)."""
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    """Key/value heads (equal to ``num_heads`` without grouped-query attention)."""
    head_dim: int
    intermediate_size: int
    """Width of the MLP (per expert for mixture-of-experts)."""
    vocab_size: int
    mlp_kind: str = "gelu"
    """``gelu`` (two matrices, up and down) or ``gated`` (SwiGLU: gate, up, down)."""
    num_experts: int = 1
    experts_per_token: int = 1
    num_encoder_layers: int = 0
    """Encoder blocks of an encoder-decoder model; 0 for decoder-only or encoder-only models."""
    is_encoder_only: bool = False
    max_positions: int = 0
    """Longest sequence the config allows (0 if unbounded, e.g. rotary models without a limit)."""
    task: str = "causal-lm"
    """Head the class puts on the backbone (``memfit.core.families.heads.TASKS``)."""
    num_labels: int = 0
    """Outputs per position (token classification) or per sequence (sequence classification);
    2 for question answering (start and end logits); 0 for language-model heads (the vocabulary)."""
    layout: "LayerLayout | None" = None
    """What the family's layer code computes, for the activation model (None: infer from the
    fields above, as memfit did before layouts existed)."""
    kv_heads_key: bool | None = None
    """Whether the config's ``to_dict()`` has ``num_key_value_heads`` (peft sizes prefix tuning's
    ``token_dim`` by it: ``peft.prompt_learning``); None: by ``model_type``
    (``MODEL_TYPES_WITHOUT_KV_HEADS_KEY``). A builder whose config gained the key in some release sets
    it from the stack's (Falcon from transformers 5.25: ``families.falcon.at_release``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerLayout:
    """How a family's transformers code computes a layer: what ``memfit.core.activations.analytic`` needs
    beyond the widths of ``ArchSpec`` to count the tensors autograd saves."""

    family: str
    """Activation model to use: ``llama`` (pre-norm RMSNorm decoders and their variants), ``gptj``,
    ``gpt2``, ``neox`` (GPT-NeoX, Falcon: LayerNorm, fused qkv, optional parallel residual),
    ``bert`` (post-norm encoders), ``t5`` (encoder-decoder)."""
    norm: str = "rms"
    """``rms`` (fp32 upcast RMSNorm: Llama's), ``rms_gemma`` (Gemma: ``1 + weight``, fp32 product),
    ``layer`` (``nn.LayerNorm``)."""
    act: str = "silu"
    """MLP activation: ``silu``, ``gelu`` (erf), ``gelu_tanh`` (``gelu_pytorch_tanh``, one op),
    ``gelu_new`` (tanh formula in elementwise ops), ``relu``."""
    gated: bool = True
    """SwiGLU-style MLP (gate, up, down) rather than up, down."""
    qk_norm: str = ""
    """``head``: RMSNorm over head_dim of q and k (Qwen3, Gemma3); ``full``: over the whole q and k
    projections (OLMo2); ``l2``: parameter-free L2 norm (Llama 4); empty: none."""
    norms: str = "pre"
    """``pre`` (before attention and MLP), ``sandwich`` (Gemma 2/3: before and after each),
    ``post`` (OLMo2: after each only)."""
    fused_qkv: bool = False
    """One projection for q, k, v (Phi-3, GPT-NeoX, Falcon), split into views."""
    fused_gate_up: bool = False
    """One projection for gate and up (Phi-3), chunked into views."""
    parallel: bool = False
    """Attention and MLP read the same normed input and add into one residual (GPT-J, NeoX)."""
    two_norms_parallel: bool = False
    """Parallel block with its own norm for the MLP (Falcon's new decoder architecture)."""
    rotary_dim: int = 0
    """Rotated channels per head (0: no rotary embeddings)."""
    embed_scale: bool = False
    """Embeddings multiplied by sqrt(hidden) (Gemma)."""
    logit_softcap: float = 0.0
    """``final_logit_softcapping`` (Gemma 2): logits / cap, tanh, x cap before the loss."""
    attn_softcap: float = 0.0
    """``attn_logit_softcapping`` (Gemma 2, eager attention)."""
    dense_layers: int = 0
    """Mixture-of-experts models: layers with a dense MLP instead of experts (DeepSeek's first_k_dense_replace,
    Qwen-MoE's mlp_only_layers, Llama 4's interleaving)."""
    dense_intermediate_size: int = 0
    shared_expert_size: int = 0
    """Width of the always-on shared expert(s) of a MoE layer (0: none)."""
    router_renorm: bool = False
    """The top-k routing weights are renormalised to sum to 1 (Mixtral; ``norm_topk_prob``)."""
    shared_expert_gate: bool = False
    """Qwen2-MoE's sigmoid gate on the shared expert."""
    moe_kind: str = ""
    """``grouped`` (transformers 5's grouped_mm experts: tokens sorted by expert), ``llama4`` (every
    expert runs on every token, scaled by its router score), empty without experts."""
    mla: tuple[int, int, int, int, int] = ()
    """DeepSeek multi-head latent attention: (q_lora_rank or 0, kv_lora_rank, qk_nope_head_dim,
    qk_rope_head_dim, v_head_dim)."""
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    relative_attention: str = ""
    """``t5`` (bucketed bias added to the scores), ``deberta`` (disentangled c2p/p2c), empty: none."""
    relative_buckets: int = 0
    position_buckets: int = 0
    """DeBERTa-v2: relative positions kept (2 x att_span rows of rel_embeddings)."""
    tied_embeddings: bool = False
    pooler: bool = False
    """A pooler (dense + tanh on the first token) before a sequence-classification head."""
    head_transform: bool = False
    """Masked-LM head with a dense + activation + LayerNorm transform before the decoder (BERT)."""
    sliding_layers: int = 0
    """Layers with sliding-window attention (an explicit mask for sdpa)."""
    sliding_window: int = 0
    layer_kinds: tuple[str, ...] = ()
    """Per layer, when layers differ: ``m`` (experts) or ``d`` (dense MLP), plus ``s`` for a
    sliding-window layer and ``n`` for a layer without q/k norm (Llama 4's NoPE layers)."""
    classifier_dropout: float = 0.1
    """Dropout before a token classifier (GenericForTokenClassification: ``classifier_dropout``, else
    ``hidden_dropout``, else 0.1; BERT: ``hidden_dropout_prob``; T5: ``classifier_dropout``, 0.0)."""
    rotary_keeps_dtype: bool = False
    """The rotated q and k are cast back to the projections' dtype (OLMo2's ``.to(q_type)``, Llama 4's
    ``type_as``) rather than promoted to that of cos/sin (the residual stream's: fp32 under AMP)."""
    eager_softmax_fp32: bool = True
    """Eager attention's softmax runs in fp32 (``softmax(..., dtype=torch.float32).to(query.dtype)``);
    False where it runs in the scores' dtype (Llama 4's ``eager_attention_forward``)."""
    rotary_fp32: bool = False
    """cos/sin kept in fp32 (OLMo2 rotates in fp32) rather than the training dtype."""
    loss_upcast: bool = True
    """The loss upcasts the logits to fp32 (transformers/loss/loss_utils.py ``ForCausalLMLoss``,
    ``ForMaskedLMLoss``); False where the model calls ``CrossEntropyLoss`` on them directly (BERT's
    masked LM, T5's seq2seq LM)."""
    shared_attention: bool = False
    """The attention runs through transformers' shared ``eager_attention_forward`` /
    ``ALL_ATTENTION_FUNCTIONS`` (``repeat_kv``, the fp32 softmax) on q, k, v with their own head counts,
    as the Llama-style families do, rather than the family's own code (Falcon from transformers 5.25:
    ``families.falcon.at_release``)."""


@dataclass(frozen=True, slots=True)
class ModelShape:
    """Every parameter of a model plus its architecture numbers; no tensors, no torch."""

    name: str
    """Model id or path the user gave."""
    architecture: str
    """transformers class that builds it, e.g. ``GPTJForCausalLM``."""
    arch: ArchSpec
    params: tuple[ParamSpec, ...]
    buffers: tuple[BufferSpec, ...] = ()
    """Every buffer as ``named_buffers()`` yields it, persistent or not (empty if it has none)."""
    notes: tuple[str, ...] = ()
    """What the builder resolved or ignored that the user should hear (e.g. the head it chose)."""
    source: str = "pure"
    """``pure``: memfit's family builder; ``meta``: read from a meta-device build of the
    transformers class (a model_type without a pure builder)."""
    config: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    """The parsed config.json the shape was built from (``core.shapes.build_model_shape`` sets it; None when
    not known). Not compared or hashed: the params and buffers are the shape. Read by a tuner that builds a
    second model from the base's config (SHADOW's mirror backbone, ``core.peft.tuners.shadow``)."""

    @property
    def total_params(self) -> int:
        return sum(p.numel for p in self.params)

    @property
    def trainable_params(self) -> int:
        return sum(p.numel for p in self.params if p.trainable)

    @property
    def frozen_params(self) -> int:
        return self.total_params - self.trainable_params

    @property
    def buffer_bytes(self) -> int:
        """Bytes of all buffers at the dtypes transformers creates them with."""
        return sum(b.nbytes for b in self.buffers)

    @property
    def largest_param(self) -> ParamSpec:
        return max(self.params, key=lambda p: p.numel)

    def with_params(self, params: tuple[ParamSpec, ...]) -> "ModelShape":
        return replace(self, params=params)

    def with_buffers(self, buffers: tuple[BufferSpec, ...]) -> "ModelShape":
        return replace(self, buffers=buffers)

    def with_notes(self, notes: tuple[str, ...]) -> "ModelShape":
        return replace(self, notes=(*self.notes, *notes))
