"""torch.nn building blocks written as parameter shapes, so families read like the modeling code.

Each helper returns ``(suffix, shape)`` pairs in the order ``nn.Module.named_parameters`` yields
them: a module's own parameters (``weight`` then ``bias``) before its children's. ``stack`` turns
a per-block template into the ``ParamSpec`` rows of ``N`` numbered blocks (``h.0.``, ``h.1.`` ...),
which is what keeps building an 80-layer model at well under a millisecond.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from memfit.core.model import ParamSpec

Shape = tuple[int, ...]
Entry = tuple[str, Shape]


def linear(name: str, in_features: int, out_features: int, *, bias: bool = True) -> list[Entry]:
    """``nn.Linear(in, out)``: weight ``(out, in)``, bias ``(out,)``."""
    entries = [(f"{name}.weight", (out_features, in_features))]
    if bias:
        entries.append((f"{name}.bias", (out_features,)))
    return entries


def conv1d(name: str, in_features: int, out_features: int) -> list[Entry]:
    """GPT-2's ``Conv1D(nf=out, nx=in)`` (transformers.pytorch_utils): weight ``(in, out)``."""
    return [(f"{name}.weight", (in_features, out_features)), (f"{name}.bias", (out_features,))]


def layer_norm(name: str, dim: int, *, bias: bool = True, affine: bool = True) -> list[Entry]:
    """``nn.LayerNorm(dim)``: weight and bias ``(dim,)``; none with ``elementwise_affine=False``."""
    if not affine:
        return []
    entries = [(f"{name}.weight", (dim,))]
    if bias:
        entries.append((f"{name}.bias", (dim,)))
    return entries


def rms_norm(name: str, dim: int) -> list[Entry]:
    """RMSNorm (Llama, Mistral, Qwen2) and T5's LayerNorm: weight ``(dim,)``, no bias."""
    return [(f"{name}.weight", (dim,))]


def embedding(name: str, num_embeddings: int, dim: int) -> list[Entry]:
    """``nn.Embedding(num, dim)``: weight ``(num, dim)``."""
    return [(f"{name}.weight", (num_embeddings, dim))]


def prefixed(prefix: str, entries: Iterable[Entry]) -> list[Entry]:
    """The same entries under ``prefix.``."""
    return [(f"{prefix}.{suffix}", shape) for suffix, shape in entries]


def specs(entries: Iterable[Entry]) -> list[ParamSpec]:
    """``ParamSpec`` rows for entries that are not repeated."""
    return [ParamSpec(name, shape) for name, shape in entries]


def stack(prefix: str, count: int, block: Sequence[Entry]) -> list[ParamSpec]:
    """``ParamSpec`` rows of ``count`` identical blocks of an ``nn.ModuleList`` named ``prefix``."""
    return [
        ParamSpec(f"{prefix}.{index}.{suffix}", shape)
        for index in range(count)
        for suffix, shape in block
    ]


def stack_layers(prefix: str, templates: Sequence[Sequence[Entry]]) -> list[ParamSpec]:
    """``ParamSpec`` rows of an ``nn.ModuleList`` whose layers differ (``templates[i]`` is layer i),
    e.g. dense and mixture-of-experts layers."""
    return [
        ParamSpec(f"{prefix}.{index}.{suffix}", shape)
        for index, block in enumerate(templates)
        for suffix, shape in block
    ]
