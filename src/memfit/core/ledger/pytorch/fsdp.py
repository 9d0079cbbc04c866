"""FSDP: ``fully_shard`` (FSDP2, ``framework: fsdp2``) and ``FullyShardedDataParallel`` (FSDP1,
``framework: fsdp``), as accelerate 1.15 prepares them, in torch 2.13.

Units (``FsdpSettings.wrap_policy``, built in ``fsdp_units``): ``transformer`` wraps each decoder block; accelerate's FSDP2
prepare (``utils/fsdp_utils.py:fsdp2_prepare_model``) also shards the input embedding on its own
(untied models) and the tail ``[final norm, output head]`` with ``reshard_after_forward=False``; the
root takes what is left. ``size`` wraps a block if it has at least ``min_num_params`` (else all blocks
as one unit when together they do); ``none`` is one unit.

FSDP2 (``torch/distributed/fsdp/_fully_shard``), per parameter: ``FSDPParam._init_sharded_param``
keeps a padded dim-0 chunk (``torch.chunk``: ``ceil(dim0 / S)`` rows x the rest, S = shard group
size) in the parameter's dtype; ``foreach_all_gather`` makes a flat output of ``S x`` the group's
padded shards (after copying the shards into a flat ``param_dtype`` input under mixed precision),
``foreach_all_gather_copy_out`` copies it into one unsharded tensor per param; in backward the flat
output then dies, in forward it is kept in ``comm_ctx.all_gather_state`` until the next unit's
copy-out (``FSDPParamGroup.wait_for_unshard``), the last one until the root's post-forward (``FSDPState._post_forward``); ``reshard`` frees the unsharded tensors (not after forward for ``reshard_after_forward=False``
units). In backward the unit is all-gathered again and the one before it prefetched
(``_backward_prefetch``); ``post_backward`` hands the unsharded gradients of the trained params to
``foreach_reduce``: a flat reduce-scatter input (``reduce_dtype``) they are copied into, a
``1/S`` output whose views become the sharded ``.grad`` (cast to the param's dtype first if the
reduce dtype differs); the input is retained until the next unit's reduce-scatter
(``reduce_scatter_max_input_buffers`` = 1). ``CPUOffloadPolicy``: shards pinned in host memory,
gradients copied to pinned host tensors, the optimizer steps on the host.

FSDP1 (``torch/distributed/fsdp/_flat_param.py``), per unit: one ``FlatParameter`` of the unit's
params (each aligned to 16 bytes under ``use_orig_params``), padded to a multiple of S, sharded
``1/S``; unsharding allocates the full padded flat (``_full_param_padded``, plus a low-precision
shard copy ``_mp_shard`` under mixed precision); the gradient is a full padded flat for the whole
unit, frozen params included, whenever any of its params trains, reduce-scattered into the shard
(``_saved_grad_shard``). ``SHARD_GRAD_OP`` keeps every unit unsharded from forward to backward;
``NO_SHARD`` keeps everything whole (S = 1); ``HYBRID_SHARD`` shards within a node. FSDP1
``CPUOffload(offload_params=True)`` (``FlatParamHandle.init_flat_param_attributes``, at the root's
lazy init before the first forward): every flat parameter, frozen ones included, gets a pinned copy
of its local shard (``_local_shard.pin_memory()``) and a pinned gradient buffer of the same size
(``_cpu_grad = zeros_like(_local_shard).pin_memory()``; the pageable zeros it is copied from, one
shard for an instant, is not booked); the pageable shard the constructor left lives until the
unit's first unshard (``pre_unshard``'s ``flat_param_to(device)`` replaces ``flat_param.data``);
each unshard copies the shard to the device first (``flat_param_to``, or under mixed precision
``_use_low_precision_shard``: the low-precision copy and the full-precision ``.to(device)`` it is
copied from), dead once gathered; the reduce-scattered gradient is copied into ``_cpu_grad`` and
kept on the device as ``_saved_grad_shard`` until the end of backward
(``prepare_gradient_for_optim``); ``_cpu_grad`` is never freed (``zero_grad`` only drops
``.grad``), and gradient accumulation outside ``no_sync`` overwrites it (the TODO in
``prepare_gradient_for_backward``: no device copy of the earlier micro-steps' gradient).

The optimizer sees the local shards: FSDP2 each param's (rank 0's) chunk, FSDP1 with
``use_orig_params`` each trained param's part of this rank's shard (rank 0: the start of each flat),
without it the whole flat shard. Numbers are rank 0's.
"""

from __future__ import annotations


from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger.pytorch.optim import STATES, TEMPS, record_clip_and_unscale, record_optimizer_step, trainer_groups
from memfit.core.ledger.pytorch.params import TorchModel, TParam, free_each
from memfit.core.ledger.pytorch.setup import (HOST_BUFFERS, HOST_LOADED, QUANT, record_cuda_context, record_load,
                                          record_optimizer_construction)
from memfit.core.ledger.pytorch.step import (alloc_parts, declare_step, end_forward, forward_stage, free_parts,
                                           free_stage_act, loss_backward_end, loss_backward_start, record_workers)
from memfit.core.ledger.pytorch.step_context import CASTS, RECOMPUTE, GradSink, build_step_context
from memfit.core.ledger_types import Device, TracedStep
from memfit.core.ledger.pytorch.fsdp_units import Piece, Unit, build_units, optimizer_params, shard_group_size, sharded_dims
from memfit.core.optimizers import OptimizerModel
from memfit.core.precision import DTYPE_BYTES
from memfit.core.scenario.types import Scenario

SHARDS = "fsdp.sharded_params"
UNSHARDED = "fsdp.unsharded_params"
AG_FLAT = "fsdp.all_gather_buffers"
UNSHARDED_GRADS = "fsdp.unsharded_grads"
RS_IN = "fsdp.reduce_scatter_input"
SHARD_GRADS = "fsdp.sharded_grads"
HOST_GRADS = "fsdp.offloaded_grads"
FULL_ON_GPU = "fsdp.full_param_while_sharding"
QSTATES = "fsdp.replicated_quant_states"
MP_SHARD = "fsdp.mp_shard"
UNPINNED = "fsdp.sharded_params_unpinned"
CPU_GRADS = "fsdp.cpu_grads"
H2D_SHARD = "fsdp.shard_on_device"
SRC2 = "torch 2.13 distributed/fsdp/_fully_shard"
SRC1 = "torch 2.13 distributed/fsdp/_flat_param.py"
ACC = "accelerate 1.15 utils/fsdp_utils.py"



class FsdpRun:
    """The FSDP recipe's state while the timeline is written."""

    def __init__(self, t: Timeline, sc: Scenario, m: TorchModel, opt: OptimizerModel) -> None:
        from memfit.core.stack.transformers import fsdp_efficient_loading

        self.t, self.sc, self.m, self.opt = t, sc, m, opt
        if sc.load.fsdp_loading is not None:  # the script's own loader, as given
            from memfit.core.scenario.types import FSDP_LOADINGS

            self.loading, self.loading_why = sc.load.fsdp_loading, (
                f"load.fsdp_loading {sc.load.fsdp_loading} (the script's own loader, given): "
                f"{FSDP_LOADINGS[sc.load.fsdp_loading]}")
        else:
            self.loading, self.loading_why = (fsdp_efficient_loading(sc.versions.transformers, quantized=sc.quant.enabled)
                                              if sc.fsdp.cpu_ram_efficient_loading else
                                              ("every_rank", "cpu_ram_efficient_loading off: every rank loads"))
        """``stack.transformers.fsdp_efficient_loading``'s mode: rank0_host, rank0_host_quantized, every_rank."""
        self.fsdp2 = sc.framework == "fsdp2"
        self.S = shard_group_size(sc)
        self.units = build_units(sc, m)
        f = sc.fsdp
        self.offload = f.cpu_offload
        mp = f.mixed_precision
        self.param_bytes = DTYPE_BYTES[mp] if mp != "none" else None
        self.reduce_bytes = DTYPE_BYTES[mp] if mp != "none" else None
        self.unsharded_live: set[int] = set()
        self.issued: dict[int, int] = {}
        self.retained_flat = 0
        self.in_forward = False
        self.rs_retained = 0
        self.shard_dev = Device.CPU_PINNED if self.offload else Device.GPU
        self.offload1 = self.offload and not self.fsdp2
        """FSDP1 CPU offload: pinned at lazy init, ``_cpu_grad`` per flat parameter (module docstring)."""
        self.unpinned: dict[int, int] = {}
        """FSDP1 offload: unit -> bytes of the pageable shard its constructor left, until its first unshard."""
        self.saved_grads = 0
        """FSDP1 offload: the device ``_saved_grad_shard`` bytes kept until the end of backward."""

    # ---- sizes
    def gather_elem(self, pc: Piece) -> int:
        if pc.params[0].quantized:
            return pc.elem
        return self.param_bytes or pc.elem

    def unit_unsharded(self, u: Unit) -> list[int]:
        return [pc.shard_numel * self.S * self.gather_elem(pc) for pc in u.pieces]

    # ---- declarations
    def declare(self) -> None:
        t, S = self.t, self.S
        src = SRC2 if self.fsdp2 else SRC1
        n_sh = sum(u.shard_bytes for u in self.units)
        t.declare(SHARDS, name=f"sharded params (1/{S} each" + (", pinned on the host: CPU offload)" if self.offload else ")"),
                  device=self.shard_dev, category="params",
                  formula=(f"{sum(len(u.pieces) for u in self.units)} " + ("params: ceil(dim0/S) rows x the rest"
                           if self.fsdp2 else "flat params: padded to a multiple of S") + f", S = {S}: {n_sh:,} B"),
                  source=f"{src}:" + ("_fsdp_param.py:FSDPParam._init_sharded_param" if self.fsdp2 else
                                      "FlatParamHandle._init_flat_param_and_metadata / shard"))
        t.declare(UNSHARDED, name="unsharded (all-gathered) params of the units being computed", device=Device.GPU,
                  category="params", exact=False,
                  formula=f"S x padded shard per param of a unit, in {self.sc.fsdp.mixed_precision if self.param_bytes else 'their dtype'}; "
                          "one unit in forward (plus those not resharded), two in backward (prefetch)",
                  source=f"{src}:" + ("_fsdp_collectives.py:foreach_all_gather_copy_out" if self.fsdp2 else
                                      "_flat_param.py:_alloc_padded_unsharded_flat_param"))
        t.declare(AG_FLAT, name="all-gather flat buffers (input copy, output) while a unit is gathered", device=Device.GPU,
                  category="buffers", formula="S x the unit's padded shards (+ its param_dtype input copy)",
                  source=f"{SRC2}/_fsdp_collectives.py:foreach_all_gather" if self.fsdp2 else f"{SRC1}:_all_gather_flat_param")
        t.declare(UNSHARDED_GRADS, name="unsharded gradients of a unit before its reduce-scatter", device=Device.GPU,
                  category="grads", formula="trained params' full gradients" if self.fsdp2 else
                  "the unit's full padded flat gradient (frozen params included)",
                  source=f"{SRC2}/_fsdp_param_group.py:post_backward" if self.fsdp2 else f"{SRC1} (flat_param.grad)")
        t.declare(RS_IN, name="reduce-scatter input (retained until the next unit's)", device=Device.GPU,
                  category="buffers", formula="the unit's padded gradients in the reduce dtype",
                  source=f"{SRC2}/_fsdp_collectives.py:foreach_reduce" if self.fsdp2 else
                  "torch 2.13 distributed/fsdp/_runtime_utils.py:_reduce_grad")
        t.declare(SHARD_GRADS, name="sharded gradients (1/S)", device=Device.GPU, category="grads",
                  formula="reduce-scatter outputs, the params' dtype",
                  source=f"{SRC2}/_fsdp_collectives.py:foreach_reduce (new_sharded_grad)" if self.fsdp2 else
                  "torch 2.13 distributed/fsdp/_runtime_utils.py:_accumulate_sharded_grad")
        t.declare(HOST_GRADS, name="sharded gradients copied to pinned host memory (CPU offload)",
                  device=Device.CPU_PINNED, category="grads", formula="1/S of the trained params' gradients",
                  source=f"{SRC2}/_fsdp_collectives.py:foreach_reduce (.to(cpu))" if self.fsdp2 else
                  "torch 2.13 distributed/fsdp/_runtime_utils.py:_post_backward_use_sharded_grad_views")
        t.declare(FULL_ON_GPU, name="full params of a unit on the device while they are sharded", device=Device.GPU,
                  category="params", formula="one unit (accelerate's efficient loading: one param at a time)",
                  source=f"{ACC}:fsdp2_prepare_model / fsdp2_load_full_state_dict" if self.fsdp2 else
                  f"{SRC1}:FlatParamHandle.flatten_tensors")
        t.declare(QSTATES, name="bitsandbytes quant states (absmax, codes), not sharded", device=Device.GPU,
                  category="params", formula="per quantized weight, every rank", source="bitsandbytes 0.50.2 QuantState")
        t.declare(MP_SHARD, name="low-precision shard copy (FSDP1 mixed precision)", device=Device.GPU,
                  category="params", formula="1/S flat in param_dtype", source=f"{SRC1}:_use_low_precision_shard")
        if self.offload1:
            t.declare(UNPINNED, name="sharded params in pageable host memory until lazy init pins them and the unit "
                      "first runs (FSDP1 CPU offload)", device=Device.CPU_PAGEABLE, category="params",
                      formula="each flat param's local shard, until its first unshard",
                      source=f"{SRC1}:FlatParamHandle.flat_param_to (pre_unshard)")
            t.declare(CPU_GRADS, name="pinned gradient buffer per flat param, frozen ones included (FSDP1 CPU offload)",
                      device=Device.CPU_PINNED, category="grads", formula="one local shard per flat param, kept",
                      source=f"{SRC1}:FlatParamHandle.init_flat_param_attributes (_cpu_grad)")
            t.declare(H2D_SHARD, name="local shard copied to the device before its all-gather (FSDP1 CPU offload)",
                      device=Device.GPU, category="params", formula="1/S flat, while the unit is gathered",
                      source=f"{SRC1}:FlatParamHandle.pre_unshard (flat_param_to / _use_low_precision_shard)")

    # ---- setup
    def setup(self, where) -> None:
        t, sc, m = self.t, self.sc, self.m
        f = sc.fsdp
        t.phase("setup", f"{'fully_shard' if self.fsdp2 else 'FullyShardedDataParallel'} per unit "
                         f"({len(self.units)} units, shard group {self.S}), optimizer construction")
        record_cuda_context(t, sc)
        self.declare()
        efficient = self.fsdp2 and self.loading == "rank0_host"  # accelerate's fsdp2_load_full_state_dict
        on_gpu_already = sc.quant.enabled and self.loading == "every_rank"  # bitsandbytes loaded it onto the GPU
        for i, u in enumerate(self.units):
            full = []
            for pc in u.pieces:
                nb = sum(p.nbytes if not p.quantized else sharded_dims(p, sc)[0] * pc.elem for p in pc.params)
                if not on_gpu_already and t.accelerator == "cuda":
                    if efficient:
                        t.alloc(FULL_ON_GPU, nb)  # full_tensor = sd[name].to(device) on rank 0 (empty elsewhere)
                        t.alloc(SHARDS, pc.shard_bytes)
                        t.free(FULL_ON_GPU, nb)
                        continue
                    t.alloc(FULL_ON_GPU, nb)  # fully_shard moves the unit to the device first
                    full.append(nb)
                if not self.fsdp2:  # FlatParamHandle.flatten_tensors: torch.cat of the unit's params (padded)
                    t.alloc(FULL_ON_GPU, pc.numel * pc.elem)
                # new_zeros(padded shard) (FSDP1: the chunk's clone), copied; FSDP1 offload: pageable until lazy init
                t.alloc(UNPINNED if self.offload1 else SHARDS, pc.shard_bytes)
                if self.offload1:
                    self.unpinned[i] = self.unpinned.get(i, 0) + pc.shard_bytes
                if not self.fsdp2:
                    t.free(FULL_ON_GPU, pc.numel * pc.elem)
            if full:
                t.free(FULL_ON_GPU)
            for pc in u.pieces:  # the host (or directly loaded) copies die with the unit's fully_shard
                for p in pc.params:
                    key, dtype = where.pop(p.name, (None, None))
                    if key is None:
                        continue
                    nb = sum(q.nbytes for q in p.quant[:1]) if dtype == "q" else p.numel * DTYPE_BYTES[dtype]
                    t.free(key, min(nb, t.live_bytes(key)))
                    if dtype == "q":  # the quantization state: not flattened, kept whole on every rank
                        for q in p.quant[1:]:
                            t.free(QUANT, q.nbytes)
        if sc.quant.enabled:
            rest = sum(sum(q.nbytes for q in p.quant[1:]) for p in m.params if p.quantized)
            t.alloc(QSTATES, rest)
        live = t.live_bytes(HOST_BUFFERS)
        if live:
            t.declare("move.buffers", name="module buffers on the device", device=Device.GPU, category="buffers",
                      formula=f"{live:,} B", source="torch nn/modules/module.py:Module._apply")
            t.alloc("move.buffers", live)
            t.free(HOST_BUFFERS)
        if t.live_bytes(HOST_LOADED):
            t.free(HOST_LOADED)
        record_optimizer_construction(t, self.opt)

    def lazy_init(self) -> None:
        """FSDP1 CPU offload, the root's lazy init before the first forward: every flat parameter's
        local shard pinned (a copy) and its ``_cpu_grad`` pinned, the root's first, then the other units
        in module order (``_runtime_utils.py:_share_state_and_init_handle_attrs``)."""
        if not self.offload1:
            return
        for u in sorted(self.units, key=lambda u: u.name != "root"):
            for pc in u.pieces:
                self.t.alloc(SHARDS, pc.shard_bytes)  # _local_shard.pin_memory()
                self.t.alloc(CPU_GRADS, pc.shard_bytes)  # zeros_like(_local_shard).pin_memory()

    # ---- gather / reshard
    def issue(self, i: int) -> None:
        """FSDP2 ``foreach_all_gather``: the flat output (and the ``param_dtype`` input copy) of unit
        ``i``; a backward prefetch stops here until the unit's own ``wait_for_unshard``."""
        if i in self.issued or i in self.unsharded_live or i < 0 or i >= len(self.units):
            return
        t = self.t
        u = self.units[i]
        outs = self.unit_unsharded(u)
        copy_in = sum(pc.shard_numel * self.gather_elem(pc) for pc in u.pieces) if self.param_bytes else 0
        t.alloc(AG_FLAT, copy_in)  # flat_foreach_copy_input (param_dtype)
        t.alloc(AG_FLAT, sum(outs))  # all_gather_output
        t.free(AG_FLAT, copy_in)
        self.issued[i] = sum(outs)

    def unshard(self, i: int) -> None:
        if i in self.unsharded_live or i < 0 or i >= len(self.units):
            return
        t = self.t
        u = self.units[i]
        outs = self.unit_unsharded(u)
        if self.fsdp2:
            self.issue(i)
            if self.in_forward and self.retained_flat:
                # wait_for_unshard in forward: the previous unit's all-gather result, kept for overlap
                # in comm_ctx.all_gather_state, is freed now
                t.free(AG_FLAT, self.retained_flat)
                self.retained_flat = 0
            for n in outs:
                t.alloc(UNSHARDED, n)  # foreach_all_gather_copy_out: per-param all_gather_outputs
            flat = self.issued.pop(i)
            if self.in_forward and self.S > 1:
                self.retained_flat = flat  # kept until the next forward copy-out (even through backward)
            else:
                t.free(AG_FLAT, flat)
        else:
            for pc, n in zip(u.pieces, outs):
                mp = self.param_bytes and self.param_bytes != pc.elem
                if mp:
                    t.alloc(MP_SHARD, pc.shard_numel * self.param_bytes)
                if self.offload1:  # the local shard to the device (under mp: .to(device), copied into _mp_shard)
                    t.alloc(H2D_SHARD, pc.shard_bytes)
                    if mp:
                        t.free(H2D_SHARD, pc.shard_bytes)
                    if i in self.unpinned:  # flat_param.data no longer holds the constructor's pageable shard
                        t.free(UNPINNED, self.unpinned.pop(i))
                t.alloc(UNSHARDED, n)
                if self.offload1 and not mp:
                    t.free(H2D_SHARD, pc.shard_bytes)
                if mp:
                    t.free(MP_SHARD, pc.shard_numel * self.param_bytes)
        self.unsharded_live.add(i)

    def prefetch(self, i: int) -> None:
        """Backward prefetch: FSDP2 issues the all-gather (its flat output); FSDP1 (BACKWARD_PRE)
        all-gathers straight into the unit's padded unsharded flat."""
        if self.fsdp2:
            self.issue(i)
        else:
            self.unshard(i)

    def reshard(self, i: int) -> None:
        if i not in self.unsharded_live:
            return
        free_each(self.t, UNSHARDED, self.unit_unsharded(self.units[i]))
        self.unsharded_live.discard(i)

    def eval_gathered(self) -> tuple[int, str]:
        """Unsharded params while an evaluation forward runs (an estimate): under FULL_SHARD and
        HYBRID_SHARD the largest unit and the next one (prefetched, or FSDP2's all-gather output kept
        for overlap); SHARD_GRAD_OP keeps every unit unsharded after its forward (no backward comes
        to reshard it); NO_SHARD has nothing to gather."""
        sizes = [sum(self.unit_unsharded(u)) for u in self.units]
        strategy = self.sc.fsdp.sharding_strategy
        if self.S == 1 or strategy == "NO_SHARD" or not sizes:
            return 0, "nothing gathered (one shard)"
        if strategy == "SHARD_GRAD_OP":
            return sum(sizes), f"every unit unsharded ({len(sizes)} units, SHARD_GRAD_OP)"
        pair = max((a + b for a, b in zip(sizes, sizes[1:])), default=sizes[0])
        return pair, f"the two largest consecutive units unsharded: {pair:,} B"

    def unit_of_stage(self, s: int) -> list[int]:
        return [i for i, u in enumerate(self.units) if s in u.stages]

    # ---- gradients
    def reduce(self, i: int, first_micro: bool) -> None:
        t = self.t
        u = self.units[i]
        tr = [pc for pc in u.pieces if pc.trainable]
        if not tr:
            return
        gbytes = [pc.shard_numel * self.S * (self.param_bytes or pc.elem) for pc in tr]
        rb = [pc.shard_numel * self.S * (self.reduce_bytes or pc.elem) for pc in tr]
        if self.rs_retained:  # the previous unit's input, kept until now
            t.free(RS_IN, self.rs_retained)
            self.rs_retained = 0
        t.alloc(RS_IN, sum(rb))
        free_each(t, UNSHARDED_GRADS, gbytes)  # copied in: the unsharded grads die
        out = sum(n // self.S for n in rb)
        t.alloc(SHARD_GRADS, out)  # reduce-scatter output
        cast = sum(pc.shard_numel * pc.elem for pc in tr)
        if self.reduce_bytes and cast != out:
            t.alloc(SHARD_GRADS, cast)  # _to_dtype_if_needed: the sharded grad in the param's dtype
            t.free(SHARD_GRADS, out)
        if self.offload1:  # _cpu_grad.copy_(...): the device one is kept as _saved_grad_shard until backward ends
            self.saved_grads += cast
        elif self.offload:  # new_sharded_grad.to(cpu): pinned host copy; the device one dies
            t.alloc(HOST_GRADS, cast)
            t.free(SHARD_GRADS, cast)
            if not first_micro:
                t.free(HOST_GRADS, cast)  # added into the existing host gradient
        elif not first_micro:
            t.free(SHARD_GRADS, cast)  # added into the existing sharded gradient
        self.rs_retained = sum(rb)

    def grads_of_stage(self, s: int) -> None:
        """Autograd makes the unsharded gradients of the trained params of stage ``s``."""
        for i in self.unit_of_stage(s):
            u = self.units[i]
            for pc in u.pieces:
                if not pc.trainable:
                    continue
                if self.fsdp2:
                    if any(p.stage == s for p in pc.params):
                        self.t.alloc(UNSHARDED_GRADS, pc.shard_numel * self.S * (self.param_bytes or pc.elem))
                elif s == min(p.stage for p in pc.params):  # FSDP1: one flat gradient per unit
                    self.t.alloc(UNSHARDED_GRADS, pc.shard_numel * self.S * (self.param_bytes or pc.elem))


def build_fsdp_ledger(t: Timeline, sc: Scenario, m: TorchModel, opt: OptimizerModel,
                      traced: TracedStep | None = None, cache: dict | None = None) -> None:
    """``cache``: ``step_context.build_step_context``'s (the recommender's, shared between candidates)."""
    run = FsdpRun(t, sc, m, opt)
    where = record_load(t, sc, m, rank0_only=run.loading in ("rank0_host", "rank0_host_quantized"),
                        quant_to_host=run.loading in ("rank0_host_quantized", "every_rank_host_quantized"))
    run.setup(where)
    order = {p.name: k for k, p in enumerate(m.params)}
    opt_params = sorted(optimizer_params(sc, run.units, run.S), key=lambda p: order.get(p.name, len(order)))
    sink = GradSink()
    c = build_step_context(sc, m, opt, sink, traced, cache=cache)
    c.groups = trainer_groups(opt_params, split=sc.torch.trainer_param_groups)
    declare_step(t, c)
    if run.offload:  # CPUOffloadPolicy / CPUOffload: the optimizer steps on the host shards
        t.declare(STATES, name=f"{opt.label} states (host: CPU offload)", device=Device.CPU_PAGEABLE,
                  category="optimizer", formula="the local shards' states", source=opt.source)
        t.declare(TEMPS, name=f"temporaries of {opt.label}.step() on the host", device=Device.CPU_PAGEABLE,
                  category="optimizer", formula="as without offload, on the host", source=opt.source)
    ga = sc.torch.gradient_accumulation_steps
    host_opt = run.offload
    phases = [("forward", "backward", True, ga == 1)]
    if ga > 1:
        phases.append(("accum.forward", "accum.backward", False, True))
    for k, (fp, bp, first, last) in enumerate(phases):
        _fsdp_forward(run, c, fp)
        _fsdp_backward(run, c, bp, first_micro=first)
    if not opt_params:
        return
    _fsdp_opt(run, c, opt_params, "optimizer_step", first=True, host=host_opt)
    if ga > 1:
        t.phase("step2.forward", f"steady state, last micro-step of {ga}")
        for u in run.units:  # the earlier micro-steps' sharded gradients (FSDP1 offload: in _cpu_grad already)
            n = sum(pc.shard_numel * pc.elem for pc in u.pieces if pc.trainable)
            if not run.offload1:
                t.alloc(HOST_GRADS if run.offload else SHARD_GRADS, n)
        _fsdp_forward(run, c, None)
        _fsdp_backward(run, c, "step2.backward", first_micro=False)
    else:
        _fsdp_forward(run, c, "step2.forward")
        _fsdp_backward(run, c, "step2.backward", first_micro=True)
    _fsdp_opt(run, c, opt_params, "step2.optimizer_step", first=False, host=host_opt)
    from memfit.core.ledger.evaluation import record_evaluation

    gathered, how = run.eval_gathered()
    record_evaluation(t, sc, dtype_bytes=c.stream_bytes, logits_bytes=c.logits_bytes, gathered_bytes=gathered,
                      gathered_formula=how, gathered_source=f"{SRC2 if run.fsdp2 else SRC1}: unshard in the forward "
                                                            "pre-hook, reshard after forward (FULL_SHARD)")
    _fsdp_save(run)


SAVE_HOST = "save.full_state_dict"


def _fsdp_save(run: FsdpRun) -> None:
    """accelerate's ``get_state_dict`` for FSDP: a full state dict gathered unit by unit to rank 0's
    host memory (FSDP1 ``FULL_STATE_DICT`` with ``FullStateDictConfig(offload_to_cpu=True,
    rank0_only=True)``; FSDP2 ``get_model_state_dict(full_state_dict=True, cpu_offload=True)``): each
    unit all-gathered, each param copied to the host, then resharded."""
    t = run.t
    t.phase("save", "full state dict gathered to rank 0's host memory, unit by unit")
    t.declare(SAVE_HOST, name="full state dict on rank 0's host", device=Device.CPU_PAGEABLE, category="params",
              formula=f"{sum(p.nbytes for p in run.m.params):,} B (every param, its dtype), rank 0 only",
              source="torch 2.13 distributed/fsdp/_state_dict_utils.py:_full_post_state_dict_hook / "
                     "distributed/checkpoint/state_dict.py:get_model_state_dict", rank0_only=True)
    if run.fsdp2:  # _gather_state_dict: DTensor.full_tensor() per param, then .cpu() (kept as is on the CPU)
        t.declare(FULL_ON_GPU, name="one param all-gathered for the state dict", device=Device.GPU, category="params",
                  formula="one param at a time", source="torch 2.13 distributed/_state_dict_utils.py:_gather_state_dict")
        for u in run.units:
            for pc in u.pieces:
                full = pc.shard_numel * run.S * pc.elem
                if t.accelerator == "cuda":
                    t.alloc(FULL_ON_GPU, full)
                    t.alloc(SAVE_HOST, full)
                    t.free(FULL_ON_GPU, full)
                else:
                    t.alloc(SAVE_HOST, full)
    else:
        for i, u in enumerate(run.units):
            was = i in run.unsharded_live
            run.unshard(i)
            for pc in u.pieces:
                for p in pc.params:
                    t.alloc(SAVE_HOST, p.nbytes)
            if not was:
                run.reshard(i)
    t.free(SAVE_HOST)


def _fsdp_forward(run: FsdpRun, c, phase: str | None) -> None:
    t = run.t
    if phase:
        t.phase(phase, "forward: each unit all-gathered, computed, resharded")
        if phase == "forward":
            record_workers(t, c.sc)
            run.lazy_init()
    run.in_forward = True
    ckpt = c.sc.train.gradient_checkpointing
    last = len(c.stages) - 1
    root = [i for i, u in enumerate(run.units) if not u.reshard_after_forward]
    for i in root:
        if 0 in run.units[i].stages:
            run.unshard(i)
    for s, st in enumerate(c.stages):
        for i in run.unit_of_stage(s):
            run.unshard(i)
        forward_stage(t, c, st, ckpt and 0 < s < last)
        for i in run.unit_of_stage(s):
            u = run.units[i]
            if u.reshard_after_forward and max(u.stages) == s:
                run.reshard(i)
    end_forward(t, c)
    if run.retained_flat:  # the root's post-forward frees the last all-gather result (_fsdp_state.py)
        t.free(AG_FLAT, run.retained_flat)
        run.retained_flat = 0
    run.in_forward = False


def _fsdp_backward(run: FsdpRun, c, phase: str, *, first_micro: bool) -> None:
    t = run.t
    t.phase(phase, "backward: units all-gathered again (one prefetched), gradients reduce-scattered")
    last = len(c.stages) - 1
    ckpt = c.sc.train.gradient_checkpointing
    order = sorted(range(len(run.units)), key=lambda i: -max(run.units[i].stages))  # backward order
    done: set[int] = set()
    loss_backward_start(t, c)
    for s in range(last, -1, -1):
        st = c.stages[s]
        if s == last - 1:
            loss_backward_end(t, c)
        units = run.unit_of_stage(s)
        for i in units:
            run.unshard(i)
            done.add(i)
            nxt = next((j for j in order if j not in done), None)
            if nxt is not None and run.sc.fsdp.backward_prefetch != "NO_PREFETCH":
                run.prefetch(nxt)  # backward prefetch: the unit that runs next
        block = ckpt and 0 < s < last
        if block:  # the block's forward again: activations, and under autocast its casts
            alloc_parts(t, RECOMPUTE, st.recompute_tensors, st.recompute)
            for n, saved, _ in st.casts:
                t.alloc(CASTS, n)
                if not saved:
                    t.free(CASTS, n)
        run.grads_of_stage(s)
        free_stage_act(t, c, st)
        if block:
            free_parts(t, RECOMPUTE, st.recompute_tensors, st.recompute)
        free_each(t, CASTS, [n for n, saved, _ in st.casts if saved])
        for i in units:
            u = run.units[i]
            if min(u.stages) == s:
                run.reshard(i)
                run.reduce(i, first_micro)
    if run.rs_retained:
        t.free(RS_IN, run.rs_retained)
        run.rs_retained = 0
    if run.saved_grads:  # FSDP1 offload: prepare_gradient_for_optim deletes _saved_grad_shard
        t.free(SHARD_GRADS, run.saved_grads)
        run.saved_grads = 0


def _fsdp_opt(run: FsdpRun, c, opt_params: list[TParam], phase: str, *, first: bool, host: bool) -> None:
    t = run.t
    t.phase(phase, "optimizer step on the local shards" + (" (on the host: CPU offload)" if host else ""))
    record_clip_and_unscale(t, opt_params, grad_scaler=run.m.precision.grad_scaler,
                            max_grad_norm=c.sc.torch.max_grad_norm)
    acc = "cpu" if host else t.accelerator
    record_optimizer_step(t, run.opt, c.groups, first=first, accelerator=acc,
                          grad_bytes=lambda p: p.numel * p.elem_bytes)
    t.end_phase()
    if not run.offload1:  # FSDP1 offload's _cpu_grad is kept (zero_grad drops .grad only)
        t.free(HOST_GRADS if host else SHARD_GRADS)
    t.free("amp.unscale")


