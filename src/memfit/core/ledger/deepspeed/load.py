"""Before the ZeRO optimizer: the user's load, DeepSpeed's cast and its whole-model move.

Mirrors transformers' ``from_pretrained`` (host memory per process) and DeepSpeed 0.19.8
``engine.py``: ``_configure_distributed_model`` -> ``_cast_module_mixed_precision`` (per-param
``p.data = p.data.to(dtype)``) -> ``self.module.to(self.device)`` unless the model was built under
``zero.Init`` (a param has ``ds_id``) or ``dont_change_device``. DeepSpeed 0.5/0.6 did
``module.half()`` then ``module.to(device)`` (engine.py ~986-1001 in v0.5.10): the same bytes.
"""

from __future__ import annotations

from memfit.core.ledger.deepspeed.common import PARTS, declare_staging, host, pin
from memfit.core.ledger.context import DTYPE_BYTES, RecipeContext
from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger_types import Device

# Keys of the full (unpartitioned) model's storage, by where it sits.
HOST_LOADED = "load.weights"
HOST_ADAPTERS = "load.adapter_weights"
HOST_CAST = "cast.params16"
GPU_FULL = "move.params"


Where = dict[str, tuple[str, str]]
"""param name -> (ledger key holding its full storage, its dtype)"""


def record_load(t: Timeline, ctx: RecipeContext) -> Where:
    """``from_pretrained`` then the PEFT wrap. Returns where each param's storage is."""
    sc = ctx.scenario
    where: Where = {}
    base = [p for p in ctx.params if not p.adapter]
    adapters = [p for p in ctx.params if p.adapter]
    n_base = sum(p.numel for p in base)
    t.declare(HOST_LOADED, name=f"model weights ({sc.load.dtype}, as from_pretrained loads them)",
              device=Device.CPU_PAGEABLE, category="params",
              formula=f"{n_base:,} params x {ctx.load_bytes} B",
              source="transformers modeling_utils.py:PreTrainedModel.from_pretrained")
    if not sc.load.low_cpu_mem_usage and sc.load.from_checkpoint:
        # Older transformers (and low_cpu_mem_usage=False): a randomly initialised model plus the
        # state dict of the shard being loaded are both alive until load_state_dict finishes.
        shards, why = checkpoint_shards(ctx)
        t.declare("load.state_dict", name="checkpoint shard's state dict held while loading (low_cpu_mem_usage=False)",
                  device=Device.CPU_PAGEABLE, category="params",
                  formula=f"one shard at a time, the largest {max(sum(b for b, _ in sh) for sh in shards):,} B ({why})",
                  source="transformers modeling_utils.py:from_pretrained (a shard's load_state_dict, then "
                         "_load_state_dict_into_model, then the next)")
        t.alloc(HOST_LOADED, n_base * ctx.load_bytes)
        for shard in shards:
            for b, _ in shard:
                t.alloc("load.state_dict", b)
            t.free("load.state_dict")
        record_heap_kept(t, shards)
    else:
        t.alloc(HOST_LOADED, n_base * ctx.load_bytes)
    for p in base:
        where[p.name] = (HOST_LOADED, sc.load.dtype)
    record_from_pretrained_kept(t, ctx)
    record_buffers_loaded(t, ctx)
    if adapters:
        n_ad = sum(p.numel for p in adapters)
        t.declare(HOST_ADAPTERS, name="PEFT-created weights (fp32, peft's default)",
                  device=Device.CPU_PAGEABLE, category="params",
                  formula=f"{n_ad:,} params x 4 B",
                  source="peft tuners (PrefixEncoder / LoraLayer.update_layer): created in fp32")
        t.alloc(HOST_ADAPTERS, n_ad * 4)
        for p in adapters:
            where[p.name] = (HOST_ADAPTERS, "fp32")
    return where


HOST_BUFFERS = "load.buffers"
GPU_BUFFERS = "move.buffers"


def record_buffers_loaded(t: Timeline, ctx: RecipeContext) -> None:
    """Module buffers (rotary tables, position ids): created by the model's ``__init__`` in their own
    dtype (from_pretrained's torch_dtype does not change them), never partitioned by ZeRO."""
    m = ctx.scenario.model
    if not m.buffers:
        return
    t.declare(HOST_BUFFERS, name="module buffers (rotary tables, position ids)", device=Device.CPU_PAGEABLE,
              category="buffers", formula=f"{len(m.buffers)} buffer(s), {m.buffer_bytes:,} B in their own dtypes",
              source="transformers modeling code (register_buffer); model.named_buffers()")
    t.alloc(HOST_BUFFERS, m.buffer_bytes)


def record_cast(t: Timeline, ctx: RecipeContext, where: Where) -> None:
    """Per-parameter cast to the training dtype, on the host where the model sits."""
    sc = ctx.scenario
    if ctx.zero_init or sc.deepspeed.precision == "fp32":
        return
    nb = ctx.model_bytes
    t.declare(HOST_CAST, name=f"parameters cast to {sc.deepspeed.precision}", device=Device.CPU_PAGEABLE,
              category="params", formula=f"{ctx.n_total:,} params x {nb} B, one param at a time (old copy freed)",
              source=("deepspeed/runtime/engine.py:_cast_module_mixed_precision (p.data = p.data.to(dtype))"
                      if sc.ds_version == "0.19" else "deepspeed/runtime/engine.py:_configure_distributed_model (module.half())"))
    for p in ctx.params:
        old, dtype = where[p.name]
        if dtype == sc.deepspeed.precision:
            continue  # already in the training dtype: .to() returns the same tensor
        t.alloc(HOST_CAST, p.numel * nb)
        t.free(old, p.numel * DTYPE_BYTES[dtype])
        where[p.name] = (HOST_CAST, sc.deepspeed.precision)
    if sc.ds_version != "0.19":
        # module.half()/bfloat16() casts floating buffers too (0.19.8 casts params only)
        for b in sc.model.buffers:
            if b.is_floating and b.dtype != sc.deepspeed.precision:
                t.alloc(HOST_BUFFERS, b.numel * nb)
                t.free(HOST_BUFFERS, b.nbytes)


def record_move(t: Timeline, ctx: RecipeContext, where: Where) -> None:
    """``self.module.to(self.device)``: the whole model onto every rank's GPU."""
    sc = ctx.scenario
    t.phase("initialize.move", "DeepSpeed moves the whole model to each rank's GPU")
    if ctx.zero_init or t.accelerator == "cpu":
        return  # skipped for zero.Init models; a no-op on the CPU accelerator
    t.declare(GPU_FULL, name="whole model on the GPU (before any partitioning)", device=Device.GPU,
              category="params", formula=f"{ctx.n_total:,} params x {ctx.model_bytes} B (every rank holds all of it)",
              source="deepspeed/runtime/engine.py:_configure_distributed_model (self.module.to(self.device))")
    for p in ctx.params:
        old, dtype = where[p.name]
        nb = DTYPE_BYTES[dtype]
        t.alloc(GPU_FULL, p.numel * nb)
        t.free(old, p.numel * nb)
        where[p.name] = (GPU_FULL, dtype)
    live = t.live_bytes(HOST_BUFFERS)
    if live:
        t.declare(GPU_BUFFERS, name="module buffers on the GPU (never partitioned)", device=Device.GPU,
                  category="buffers", formula=f"{live:,} B", source="engine.py:_configure_distributed_model (module.to)")
        t.alloc(GPU_BUFFERS, live)
        t.free(HOST_BUFFERS)



ZI_GPU = "zero_init.module_on_gpu"
ZI_CKPT = "load.checkpoint"


def checkpoint_shards(ctx: RecipeContext) -> tuple[list[list[tuple[int, str | None]]], str]:
    """The checkpoint as loaded, shard by shard: per tensor its bytes in the saved dtype and the
    base param it fills; and where the split comes from (``memfit.core.checkpoint``). Without a
    layout: one file of every base param in the load dtype."""
    from memfit.core.checkpoint import checkpoint_key

    layout = ctx.scenario.load.checkpoint
    base = [p for p in ctx.params if not p.adapter]
    if layout is None:
        return [[(p.numel * ctx.load_bytes, p.name) for p in base]], "one file, in the load dtype"
    by_key = {checkpoint_key(p.name): p.name for p in base}
    shards = [[(b, by_key.get(k)) for k, b in sh] for sh in layout.shards]
    return shards, f"{layout.source}; saved in {layout.saved_dtype}"


def small_freed_bytes(shards: list[list[tuple[int, str | None]]]) -> int:
    """Bytes of the checkpoint tensors under 32 MiB a shard-by-shard load frees after its first shard
    (the first shard's tensors are mapped: glibc's threshold rises only as they are freed; a 32 MiB
    tensor's chunk, header included, is above ``DEFAULT_MMAP_THRESHOLD_MAX`` and always mapped)."""
    from memfit.core.ledger.host_process import MMAP_THRESHOLD_MAX

    return sum(b for shard in shards[1:] for b, _ in shard if b < MMAP_THRESHOLD_MAX)


def record_heap_kept(t: Timeline, shards: list[list[tuple[int, str | None]]]) -> None:
    """The freed state dicts' heap glibc keeps (``host_process.heap_kept_part``)."""
    from memfit.core.ledger import host_process

    part = host_process.heap_kept_part(small_freed_bytes(shards))
    if part is not None:
        host_process.record(t, [part])


def record_from_pretrained_kept(t: Timeline, ctx: RecipeContext) -> None:
    """What ``from_pretrained`` leaves in the process (``host_process.from_pretrained_part``): after
    a checkpoint load only (a model built from its config reads no checkpoint)."""
    from memfit.core.ledger import host_process

    if ctx.scenario.load.from_checkpoint:
        host_process.record(t, [host_process.from_pretrained_part()])


def record_load_zero_init(t: Timeline, ctx: RecipeContext) -> dict[str, tuple[str, str]]:
    """``from_pretrained`` under ``deepspeed.zero.Init`` (or HfDeepSpeedConfig): each module's params
    are created on the GPU in the DeepSpeed dtype and partitioned when the module's ``__init__``
    returns; the checkpoint is then loaded module by module through ``GatheredParameters``.
    Returns param -> (partition key, dtype) for the base params; PEFT params are created later,
    outside Init, and are converted by the engine (see ``zero3.record_partition``)."""
    sc = ctx.scenario
    z = sc.deepspeed.zero
    declare_staging(t)
    dtype = sc.deepspeed.precision
    nb = DTYPE_BYTES[dtype]
    off = z.offload_param.device
    pinned = off != "none" and z.offload_param.pin_memory
    remote = Device.GPU if off == "none" else host(pinned)
    base = [p for p in ctx.params if not p.adapter]
    n_base = sum(p.numel for p in base)
    t.declare(PARTS, name="parameter partitions, 1/W of every param" + (" (offloaded)" if off != "none" else ""),
              device=remote, category="params",
              formula=f"sum over params of ceil(p/{ctx.world}) x {nb} B",
              source="deepspeed/runtime/zero/partition_parameters.py:Init (partition on module __init__ exit)")
    t.declare(ZI_GPU, name="one module's params, whole, on the GPU (while built, and while loaded)",
              device=Device.GPU, category="params", formula=f"largest module x {nb} B",
              source="partition_parameters.py:Init._post_init_method / GatheredParameters in from_pretrained")
    shards, why = checkpoint_shards(ctx)
    t.declare(ZI_CKPT, name="checkpoint shard in host memory while loading", device=Device.CPU_PAGEABLE,
              category="params",
              formula=f"one shard at a time, the largest {max(sum(b for b, _ in sh) for sh in shards):,} B ({why})",
              source="transformers modeling_utils.py:from_pretrained (zero3: a shard's state dict, then "
                     "_load_state_dict_into_zero3_model, then the next)")
    modules: dict[str, list] = {}
    for p in base:
        modules.setdefault(p.name.rsplit(".", 1)[0], []).append(p)
    part_key: dict[str, tuple[str, str]] = {}
    for ps in modules.values():  # build: each module created whole, then partitioned
        for p in ps:
            t.alloc(ZI_GPU, p.numel * nb)
        for p in ps:
            pin(t, PARTS, ctx.partition_numel(p) * nb, pinned)
            t.free(ZI_GPU, p.numel * nb)
            part_key[p.name] = (PARTS, dtype)
    if sc.load.from_checkpoint:
        for shard in shards:  # each shard: read it, then per module gather its params in it, copy, re-partition
            for b, _ in shard:
                t.alloc(ZI_CKPT, b)
            here = {name for _, name in shard if name}
            for ps in modules.values():
                full = sum(ctx.partition_numel(p) * ctx.world for p in ps if p.name in here) * nb
                t.alloc(ZI_GPU, full)
                t.free(ZI_GPU, full)
            t.free(ZI_CKPT)
        record_heap_kept(t, shards)
    record_from_pretrained_kept(t, ctx)
    record_buffers_loaded(t, ctx)
    adapters = [p for p in ctx.params if p.adapter]
    if adapters:
        n_ad = sum(p.numel for p in adapters)
        t.declare(HOST_ADAPTERS, name="PEFT-created weights (fp32, created outside zero.Init)",
                  device=Device.CPU_PAGEABLE, category="params", formula=f"{n_ad:,} params x 4 B",
                  source="peft tuners: created in fp32 after from_pretrained")
        t.alloc(HOST_ADAPTERS, n_ad * 4)
    return part_key
