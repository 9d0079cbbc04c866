"""FSDP's units and shards: which modules each unit wraps (``FsdpSettings.wrap_policy``), the shard
group size, each parameter's sharded dims, and the parameters the optimizer sees, for FSDP2
(``fully_shard``) and FSDP1 (``FullyShardedDataParallel``) as accelerate 1.15 prepares them, in
torch 2.13. The recipes that run the units are ``fsdp``'s (its docstring has the whole reading).

Units: ``transformer`` wraps each decoder block; accelerate's FSDP2 prepare
(``utils/fsdp_utils.py:fsdp2_prepare_model``) also shards the input embedding on its own (untied
models) and the tail ``[final norm, output head]`` with ``reshard_after_forward=False``; the root
takes what is left. ``size`` wraps a block if it has at least ``min_num_params`` (else all blocks as
one unit when together they do); ``none`` is one unit. ``peft`` is peft's ``fsdp_auto_wrap_policy``
(``peft/utils/other.py``: ``_or_policy`` of a ``lambda_auto_wrap_policy`` taking every leaf module
whose ``weight`` requires grad, and the transformer layer classes plus peft's prompt encoders), which
the Trainer sets for a PEFT model under FSDP from transformers 4.39 (``trainer.py:
_fsdp_qlora_plugin_updates``; 5.x ``distributed/fsdp.py:update_fsdp_plugin_peft``), and Answer.AI's
fsdp_qlora ``train.py`` builds the same way: each LoRA ``lora_A``/``lora_B`` Linear is a unit of its
own, nested in its block's unit, so the blocks' flat parameters hold frozen weights only.
"""

from __future__ import annotations

from dataclasses import field

from memfit.core.lean_dataclass import dataclass
from memfit.core.ledger.pytorch.params import TorchModel, TParam
from memfit.core.quant import STORAGE_BYTES, storage_elements
from memfit.core.scenario.types import Scenario
from memfit.errors import MemfitError


@dataclass
class Piece:
    """What FSDP shards: one param (FSDP2) or one unit's flat parameter (FSDP1)."""

    params: list[TParam]
    numel: int
    """Elements as FSDP sees them (a quantized weight: its packed storage's elements)."""
    elem: int
    """Element size of the sharded dtype."""
    shard_numel: int
    trainable: bool

    @property
    def shard_bytes(self) -> int:
        return self.shard_numel * self.elem


@dataclass
class Unit:
    name: str
    stages: set[int]
    pieces: list[Piece] = field(default_factory=list)
    reshard_after_forward: bool = True

    @property
    def shard_bytes(self) -> int:
        return sum(p.shard_bytes for p in self.pieces)


def shard_group_size(sc: Scenario) -> int:
    f = sc.fsdp
    W = sc.world_size
    if f.sharding_strategy == "NO_SHARD":
        return 1
    if f.sharding_strategy in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
        return f.hsdp_shard_size or sc.hardware.gpus_per_node
    return W


def sharded_dims(p: TParam, sc: Scenario) -> tuple[int, int, int]:
    """(numel, dim0, element size) as FSDP sees a param (a quantized weight is its packed storage)."""
    if p.quantized:
        n = storage_elements(sc.quant, p.shape)
        return n, n, STORAGE_BYTES[sc.quant.quant_storage] if sc.quant.method == "4bit" else 1
    return p.numel, p.shape[0] if p.shape else 1, p.elem_bytes


def build_units(sc: Scenario, m: TorchModel) -> list[Unit]:
    f = sc.fsdp
    fsdp2 = sc.framework == "fsdp2"
    S = shard_group_size(sc)
    L = m.stages - 2
    by_stage: dict[int, list[TParam]] = {}
    for p in m.params:
        by_stage.setdefault(p.stage, []).append(p)
    block_numel = [sum(p.numel for p in by_stage.get(s, [])) for s in range(1, L + 1)]
    groups: list[tuple[str, set[int], bool]] = []
    if f.wrap_policy in ("transformer", "peft") or (f.wrap_policy == "size" and block_numel and
                                                     min(block_numel) >= f.min_num_params):
        groups = [(f"block {s}", {s}, f.sharding_strategy != "SHARD_GRAD_OP") for s in range(1, L + 1)]
    elif f.wrap_policy == "size" and sum(block_numel) >= f.min_num_params:
        groups = [("blocks", set(range(1, L + 1)), f.sharding_strategy != "SHARD_GRAD_OP")]
    covered = set().union(*(g[1] for g in groups)) if groups else set()
    units: list[Unit] = []
    if fsdp2 and f.wrap_policy != "none":
        emb = [p for p in by_stage.get(0, []) if len(p.shape) == 2 and not p.adapter and p.name != m.tied_embedding]
        if emb and m.tied_embedding is None:
            units.append(Unit("input embedding", {0}, reshard_after_forward=f.sharding_strategy != "SHARD_GRAD_OP"))
    if f.wrap_policy == "peft":  # every trainable leaf module (a LoRA Linear) a unit of its own
        leaves: dict[str, list[TParam]] = {}
        for p in m.params:
            if p.trainable and p.adapter and p.linear:
                leaves.setdefault(p.name.rsplit(".", 1)[0], []).append(p)
        leaf_units = {mod: Unit(f"{mod} (peft fsdp_auto_wrap_policy)", {ps[0].stage},
                                reshard_after_forward=f.sharding_strategy != "SHARD_GRAD_OP") for mod, ps in leaves.items()}
        units += list(leaf_units.values())
        leaf_of = {p.name: leaf_units[mod] for mod, ps in leaves.items() for p in ps}
    units += [Unit(n, st, reshard_after_forward=r) for n, st, r in groups]
    if fsdp2 and f.wrap_policy != "none":
        units.append(Unit("tail (final norm, output head)", {L + 1}, reshard_after_forward=False))
    root = Unit("root", set(range(m.stages)) - covered, reshard_after_forward=False)
    assigned: dict[str, Unit] = {}
    at_stage: dict[int, list[Unit]] = {}  # the units holding each stage, in the units' order (peft's leaves apart)
    for cand in units:
        if not cand.name.endswith("(peft fsdp_auto_wrap_policy)"):
            for st in cand.stages:
                at_stage.setdefault(st, []).append(cand)
    for p in m.params:
        u = None
        if f.wrap_policy == "peft" and p.name in leaf_of:
            assigned[p.name] = leaf_of[p.name]
            continue
        for cand in at_stage.get(p.stage, ()):
            if cand.name == "input embedding" and not (len(p.shape) == 2 and not p.adapter and p.stage == 0):
                continue
            u = cand
            break
        assigned[p.name] = u or root
    units.append(root)
    members: dict[int, list[TParam]] = {}  # each unit's params in the model's order (one pass, not one per unit)
    for p in m.params:
        members.setdefault(id(assigned[p.name]), []).append(p)
    for u in units:
        ps = members.get(id(u))
        if not ps:
            continue
        if fsdp2:
            for p in ps:
                n, d0, e = sharded_dims(p, sc)
                rows = -(-d0 // S)
                u.pieces.append(Piece([p], n, e, rows * (n // d0 if d0 else 1), p.trainable))
        else:
            pieces_by_dtype = {}
            for p in ps:
                pieces_by_dtype.setdefault(sharded_dims(p, sc)[2], []).append(p)
            for e, group in pieces_by_dtype.items():
                if not f.use_orig_params:
                    _uniform_requires_grad(u, group)
                total = 0
                align = 16 // e if f.use_orig_params else 0
                for p in group:
                    if align and total % align:
                        total += align - total % align
                    total += sharded_dims(p, sc)[0]
                if total % S:
                    total += S - total % S
                u.pieces.append(Piece(group, total, e, total // S, any(p.trainable for p in group)))
    return [u for u in units if u.pieces]


def _uniform_requires_grad(u: Unit, group: list[TParam]) -> None:
    """FSDP1 without ``use_orig_params`` flattens a unit's params into one FlatParameter, which must be
    all trained or all frozen: torch raises otherwise (``_flat_param.py:_validate_tensors_to_flatten``),
    so such a plan is refused, not planned."""
    trained = [q.name for q in group if q.trainable]
    if trained and len(trained) < len(group):
        frozen = next(q.name for q in group if not q.trainable)
        raise MemfitError(
            f"FSDP1 with use_orig_params false cannot wrap unit '{u.name}': it mixes {len(trained)} trained and "
            f"{len(group) - len(trained)} frozen params (e.g. {trained[0]} and {frozen}), and torch refuses to "
            "flatten them ('Must flatten tensors with uniform requires_grad when use_orig_params=False', "
            "distributed/fsdp/_flat_param.py); give fsdp.wrap_policy peft (peft's fsdp_auto_wrap_policy: each "
            "trained Linear a unit, what the Trainer sets for a PEFT model from transformers 4.39) or "
            "use_orig_params true")


def optimizer_params(sc: Scenario, units: list[Unit], S: int) -> list[TParam]:
    """What the optimizer sees: pseudo-params of the local shard sizes (rank 0)."""
    out: list[TParam] = []
    fsdp2 = sc.framework == "fsdp2"
    for u in units:
        for pc in u.pieces:
            if fsdp2:
                p = pc.params[0]
                if p.trainable:
                    out.append(TParam(name=p.name, shape=(pc.shard_numel,), numel=pc.shard_numel, trainable=True,
                                      adapter=p.adapter, load_dtype=p.load_dtype, dtype=p.dtype, stage=p.stage,
                                      linear=p.linear, decay=p.decay))
            elif sc.fsdp.use_orig_params:
                start = 0
                align = 16 // pc.elem
                for p in pc.params:  # rank 0 holds [0, shard_numel) of the flat
                    if align and start % align:
                        start += align - start % align
                    n = sharded_dims(p, sc)[0]
                    local = max(0, min(start + n, pc.shard_numel) - start)
                    if p.trainable and local:
                        out.append(TParam(name=p.name, shape=(local,), numel=local, trainable=True, adapter=p.adapter,
                                          load_dtype=p.load_dtype, dtype=p.dtype, stage=p.stage, linear=p.linear,
                                          decay=p.decay))
                    start += n
            elif pc.trainable:
                p = pc.params[0]
                out.append(TParam(name=f"{u.name}.flat_param", shape=(pc.shard_numel,), numel=pc.shard_numel,
                                  trainable=True, adapter=False, load_dtype=p.dtype, dtype=p.dtype, stage=p.stage,
                                  linear=False, decay=True))
    return out
