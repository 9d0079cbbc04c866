"""Mixture-of-experts feed-forward blocks, as transformers 5 builds them.

Experts are fused into two 3-D parameters per layer (``<Family>Experts`` decorated with
``@use_experts_implementation``, transformers/integrations/moe.py; grouped_mm by default):
``gate_up_proj`` ``(E, 2 i, d)`` and ``down_proj`` ``(E, d, i)`` (Llama 4 stores them transposed:
``(E, d, 2 i)`` and ``(E, i, d)``). Around them:

- Mixtral, Qwen3-MoE: a router ``mlp.gate.weight`` ``(E, d)``;
- Qwen2-MoE: the router plus an always-on ``shared_expert`` (SwiGLU of width
  ``shared_expert_intermediate_size``) and its sigmoid ``shared_expert_gate`` ``(1, d)``;
- DeepSeek-V3: ``mlp.gate.weight`` (created fp32, kept fp32 by ``_keep_in_fp32_modules_strict``) with
  the buffer ``e_score_correction_bias`` ``(E,)`` fp32, and ``shared_experts`` of width
  ``moe_intermediate_size x n_shared_experts``;
- Llama 4: ``feed_forward.router`` ``(E, d)`` and a ``shared_expert`` of width ``intermediate_size``.

Which layers have experts: Qwen-MoE ``(i + 1) % decoder_sparse_step == 0`` and not in
``mlp_only_layers``; DeepSeek ``i >= first_k_dense_replace``; Llama 4 ``i in moe_layers``
(default every ``interleave_moe_layer_step``-th). The others have the family's dense MLP.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memfit.core.lean_dataclass import dataclass
from memfit.core.families.blocks import Entry, linear, prefixed
from memfit.core.families.config_fields import read_int, read_int_list
from memfit.core.families.validate import check_experts
from memfit.errors import MemfitError


@dataclass(frozen=True, slots=True, kw_only=True)
class MoeLayout:
    """The experts of a model and which layers have them."""

    experts: int
    top_k: int
    expert_size: int
    """Intermediate width of one expert."""
    moe_layers: tuple[bool, ...]
    """Per layer: experts (True) or the dense MLP (False)."""
    dense_size: int
    """Intermediate width of the dense MLP layers."""
    shared_size: int = 0
    shared_gate: bool = False
    router_buffer: bool = False


def swiglu(prefix: str, d: int, i: int, *, bias: bool = False) -> list[Entry]:
    """``gate_proj``, ``up_proj`` ``(i, d)`` and ``down_proj`` ``(d, i)``."""
    return [
        *linear(f"{prefix}.gate_proj", d, i, bias=bias),
        *linear(f"{prefix}.up_proj", d, i, bias=bias),
        *linear(f"{prefix}.down_proj", i, d, bias=bias),
    ]


def read_moe(model_type: str, config: Mapping[str, Any], layers: int, dense_size: int) -> MoeLayout:
    """The experts of ``config`` (config-class defaults where a field is absent)."""
    if model_type == "mixtral":
        experts = read_int(config, "num_local_experts", "num_experts", default=8)
        top_k = read_int(config, "num_experts_per_tok", default=2)
        check_experts(experts, top_k, experts_key="num_local_experts")
        return MoeLayout(experts=experts, top_k=top_k, expert_size=dense_size,
                         moe_layers=(True,) * layers, dense_size=dense_size)
    if model_type in ("qwen2_moe", "qwen3_moe"):
        qwen2 = model_type == "qwen2_moe"
        experts = read_int(config, "num_experts", "num_local_experts", default=60 if qwen2 else 128, minimum=0)
        top_k = read_int(config, "num_experts_per_tok", default=4 if qwen2 else 8)
        if experts:
            check_experts(experts, top_k)
        step = read_int(config, "decoder_sparse_step", default=1)
        dense_only = set(read_int_list(config, "mlp_only_layers"))
        moe = tuple(i not in dense_only and experts > 0 and (i + 1) % step == 0 for i in range(layers))
        return MoeLayout(
            experts=experts, top_k=top_k,
            expert_size=read_int(config, "moe_intermediate_size", default=1408 if qwen2 else 768),
            moe_layers=moe, dense_size=dense_size,
            shared_size=read_int(config, "shared_expert_intermediate_size", default=5632) if qwen2 else 0,
            shared_gate=qwen2,
        )
    if model_type == "deepseek_v3":
        experts = read_int(config, "n_routed_experts", "num_local_experts", default=256)
        top_k = read_int(config, "num_experts_per_tok", default=8)
        check_experts(experts, top_k, experts_key="n_routed_experts")
        size = read_int(config, "moe_intermediate_size", default=2048)
        first_dense = read_int(config, "first_k_dense_replace", default=3, minimum=0)
        groups = read_int(config, "n_group", default=8)
        topk_group = read_int(config, "topk_group", default=4)
        if experts % groups:
            raise MemfitError(f"config.json: n_routed_experts {experts} is not a multiple of n_group {groups}")
        if topk_group > groups:
            raise MemfitError(f"config.json: topk_group {topk_group} is more than n_group {groups}")
        return MoeLayout(
            experts=experts, top_k=top_k, expert_size=size,
            moe_layers=tuple(i >= first_dense for i in range(layers)), dense_size=dense_size,
            shared_size=size * read_int(config, "n_shared_experts", default=1), router_buffer=True,
        )
    if model_type == "llama4_text":
        experts = read_int(config, "num_local_experts", default=16)
        top_k = read_int(config, "num_experts_per_tok", default=1)
        check_experts(experts, top_k, experts_key="num_local_experts")
        listed = config.get("moe_layers")
        if listed is None:
            step = read_int(config, "interleave_moe_layer_step", default=1)
            moe_idx = set(range(step - 1, layers, step))
        else:
            moe_idx = set(read_int_list(config, "moe_layers"))
        size = read_int(config, "intermediate_size", default=8192)
        return MoeLayout(
            experts=experts, top_k=top_k, expert_size=size,
            moe_layers=tuple(i in moe_idx for i in range(layers)),
            dense_size=read_int(config, "intermediate_size_mlp", default=16384),
            shared_size=size,
        )
    raise AssertionError(model_type)


def moe_block(model_type: str, moe: MoeLayout, d: int) -> list[Entry]:
    """The experts layer's parameters, relative to the decoder layer."""
    E, i = moe.experts, moe.expert_size
    if model_type == "llama4_text":
        return prefixed("feed_forward", [
            ("experts.gate_up_proj", (E, d, 2 * i)),
            ("experts.down_proj", (E, i, d)),
            ("router.weight", (E, d)),
            *swiglu("shared_expert", d, moe.shared_size),
        ])
    entries: list[Entry] = [
        ("gate.weight", (E, d)),
        ("experts.gate_up_proj", (E, 2 * i, d)),
        ("experts.down_proj", (E, d, i)),
    ]
    if model_type == "qwen2_moe":
        entries += swiglu("shared_expert", d, moe.shared_size)
        entries += linear("shared_expert_gate", d, 1, bias=False)
    elif model_type == "deepseek_v3":
        entries += swiglu("shared_experts", d, moe.shared_size)
    return prefixed("mlp", entries)


def dense_block(model_type: str, moe: MoeLayout, d: int) -> list[Entry]:
    """A dense layer's MLP in a mixture-of-experts model."""
    return swiglu("feed_forward" if model_type == "llama4_text" else "mlp", d, moe.dense_size)


PER_EXPERT_LAYOUT: dict[str, tuple[str, tuple[str, str, str]]] = {
    "mixtral": ("block_sparse_moe", ("w1", "w2", "w3")),
    "qwen2_moe": ("mlp", ("gate_proj", "up_proj", "down_proj")),
    "qwen3_moe": ("mlp", ("gate_proj", "up_proj", "down_proj")),
}
"""Before transformers 5.0 each expert is its own module of three ``nn.Linear`` (v4.51.0
``modeling_mixtral.py``: ``MixtralSparseMoeBlock.gate`` then ``experts = nn.ModuleList([
MixtralBlockSparseTop2MLP ...])`` with ``w1 (d -> i)``, ``w2 (i -> d)``, ``w3 (d -> i)``, the block
``self.block_sparse_moe``; Qwen2-MoE and Qwen3-MoE ``Qwen*MoeMLP`` with ``gate_proj``, ``up_proj``,
``down_proj`` under ``self.mlp``): per model type, the block's name and the expert's three Linears
in registration order (the gate-like, the down, the up projection for Mixtral; gate, up, down for
Qwen)."""


def per_expert_params(model_type: str, params):  # noqa: ANN001, ANN201 (ParamSpec tuples)
    """``params`` (transformers 5's fused experts) as a pre-5.0 release names and shapes them: each
    ``mlp.experts.gate_up_proj`` ``(E, 2 i, d)`` / ``down_proj`` ``(E, d, i)`` pair becomes E experts of
    three 2-D Linear weights, the block renamed where that release named it otherwise (Mixtral's
    ``block_sparse_moe``). The parameter count is unchanged. ``params`` unchanged for another
    model type."""
    from dataclasses import replace

    if model_type not in PER_EXPERT_LAYOUT:
        return tuple(params)
    block, (first, second, third) = PER_EXPERT_LAYOUT[model_type]
    by_name = {p.name: p for p in params}
    out = []
    for p in params:
        head, sep, tail = p.name.partition(".mlp.")
        if not sep or not head.startswith("model.layers."):
            out.append(p)
            continue
        pre = f"{head}.{block}."
        if tail == "experts.down_proj":
            continue  # emitted with gate_up_proj, expert by expert
        if tail == "experts.gate_up_proj":
            E, two_i, d = p.shape
            i = two_i // 2
            down = by_name[f"{head}.mlp.experts.down_proj"]
            for e in range(E):
                x = f"{pre}experts.{e}."
                if model_type == "mixtral":  # w1 (gate), w2 (down), w3 (up)
                    shapes = ((first, (i, d)), (second, down.shape[1:]), (third, (i, d)))
                else:  # gate_proj, up_proj, down_proj
                    shapes = ((first, (i, d)), (second, (i, d)), (third, down.shape[1:]))
                out.extend(replace(p, name=f"{x}{n}.weight", shape=tuple(s)) for n, s in shapes)
            continue
        out.append(replace(p, name=pre + tail) if block != "mlp" else p)
    return tuple(out)
