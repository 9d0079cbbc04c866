"""Typed description of a model's parameters and architecture, built from a config alone.

Glossary:
- *param*: one ``nn.Parameter`` as ``model.named_parameters()`` yields it (tied weights once).
- *numel*: number of elements of a param; bytes come from numel times a dtype size elsewhere.
- *trainable*: ``requires_grad=True`` and handed to the optimizer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


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
    def largest_param(self) -> ParamSpec:
        return max(self.params, key=lambda p: p.numel)

    def with_params(self, params: tuple[ParamSpec, ...]) -> "ModelShape":
        return replace(self, params=params)
