"""The FSDP wrap of a non-DeepSpeed replay (``memfit.replay.pytorch.child``), as accelerate 1.15 does it.

FSDP2 (``fsdp2_prepare_model``): ``fully_shard`` on each decoder block (TRANSFORMER_BASED_WRAP), on
the input embedding of an untied model, on ``[final norm, output head]`` with
``reshard_after_forward=False``, then on the root; ``MixedPrecisionPolicy(param_dtype, reduce_dtype)``
from the mixed precision setting, ``CPUOffloadPolicy()`` for CPU offload. The replay model is built
on its device, so this is the path without ``cpu_ram_efficient_loading`` (every rank holds the model
until it is sharded).

FSDP1: ``FullyShardedDataParallel`` with ``ModuleWrapPolicy`` over the decoder block class (or
``size_based_auto_wrap_policy``), the sharding strategy, ``use_orig_params``, ``MixedPrecision``,
``CPUOffload``, ``limit_all_gathers``, ``backward_prefetch``, ``forward_prefetch``.

Attributed sizes: ``fsdp.sharded_params`` (every rank-local shard storage after wrapping).
"""

from __future__ import annotations

from memfit.replay.measurement import AttributedItem


def _block_class(model):
    import torch

    for mod in model.modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) and mod[0].__class__.__name__.endswith(("Layer", "Block")):
            return type(mod[0]), list(mod)
    raise RuntimeError("no decoder block list found")


def apply_fully_shard(model, kw: dict):
    """``fully_shard`` as accelerate's ``fsdp2_prepare_model`` applies it (transformer-layer policy)."""
    from torch.distributed.fsdp import fully_shard

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    _, blocks = _block_class(base)
    for b in blocks:
        fully_shard(b, **kw)
    emb, out = base.get_input_embeddings(), base.get_output_embeddings()
    tied = out is not None and emb.weight is out.weight
    if not tied:
        fully_shard(emb, **kw)
    norm = getattr(getattr(base, "model", base), "norm", None)
    tail = [m for m in ((norm, emb, out) if tied else (norm, out)) if m is not None]
    fully_shard(tail, **{**kw, "reshard_after_forward": False})
    root_kw = {k: v for k, v in kw.items() if k != "reshard_after_forward"}
    return fully_shard(model, **root_kw)


def wrap_fsdp(model, spec, items: list):
    import torch

    f = spec.fsdp
    mp = f.get("mixed_precision", "none")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mp)
    if spec.framework == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        mesh = init_device_mesh(spec.accelerator, (spec.world_size,))
        kw = {"mesh": mesh, "mp_policy": MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype),
              "offload_policy": CPUOffloadPolicy() if f.get("cpu_offload") else OffloadPolicy(),
              "reshard_after_forward": f.get("sharding_strategy", "FULL_SHARD") != "SHARD_GRAD_OP"}
        wrapped = apply_fully_shard(model, kw)
    else:
        import functools

        from torch.distributed.fsdp import (BackwardPrefetch, CPUOffload, FullyShardedDataParallel, MixedPrecision,
                                            ShardingStrategy)
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy, size_based_auto_wrap_policy

        cls, _ = _block_class(model)
        wrap = f.get("wrap_policy", "transformer")
        if wrap == "peft":  # the Trainer's policy for a PEFT model (transformers >= 4.39): LoRA Linears of their own
            from peft.utils.other import fsdp_auto_wrap_policy

            policy = fsdp_auto_wrap_policy(model)
        else:
            policy = (ModuleWrapPolicy({cls}) if wrap == "transformer" else
                      functools.partial(size_based_auto_wrap_policy, min_num_params=f.get("min_num_params", 100_000_000)))
        prefetch = f.get("backward_prefetch", "BACKWARD_PRE")
        wrapped = FullyShardedDataParallel(
            model, auto_wrap_policy=policy, sharding_strategy=ShardingStrategy[f.get("sharding_strategy", "FULL_SHARD")],
            use_orig_params=f.get("use_orig_params", True),
            mixed_precision=MixedPrecision(param_dtype=dtype, reduce_dtype=dtype) if dtype else None,
            cpu_offload=CPUOffload(offload_params=True) if f.get("cpu_offload") else None,
            limit_all_gathers=f.get("limit_all_gathers", True), forward_prefetch=f.get("forward_prefetch", False),
            backward_prefetch=None if prefetch == "NO_PREFETCH" else BackwardPrefetch[prefetch],
            device_id=torch.device(spec.accelerator) if spec.accelerator == "cpu" else torch.cuda.current_device())
    shards = []
    for p in wrapped.parameters():
        local = getattr(p, "_local_tensor", p)
        shards.append(local)
    from memfit.replay.pytorch.attribution import _item

    items.append(_item("fsdp.sharded_params", "setup", shards))
    return wrapped


__all__ = ["wrap_fsdp", "AttributedItem"]
