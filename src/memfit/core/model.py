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
from dataclasses import dataclass, replace
from types import MappingProxyType


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

    No buffer of the supported families does: transformers 5 builds rotary tables with an explicit
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
