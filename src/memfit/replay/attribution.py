"""Sizes read straight off DeepSpeed's objects, so a replay names what its bytes are.

``read_items(engine, at=...)`` walks the engine's optimizer (DeepSpeed 0.19.8 attribute names) and
returns one ``AttributedItem`` per key below that exists; ``model_items`` reads the model before
DeepSpeed touches it. Bytes are ``numel x element_size`` of the tensors the attribute holds, each
tensor (same data pointer, numel and dtype) counted once within a key.

Keys (``at`` = ``load``: after the model is built; ``initialize``: right after
``deepspeed.initialize``; ``step``: after the first optimizer step the fp16 loss scaler did not
skip, or after the last step if it skipped them all):

model (``load``)
    ``model.params``, ``model.params.trainable``, ``model.params.frozen``: bytes of the params as the
    model defines them (``ds_numel`` for params zero.Init already partitioned; device ``logical``
    then), ``model.buffers``; ``load.ds_tensor``: the partitions zero.Init allocated (zero_init only).

ZeRO-3 (``DeepSpeedZeroOptimizer_Stage3``, runtime/zero/stage3.py)
    ``zero3.ds_tensor.trainable``: ``param.ds_tensor`` of the params in ``fp16_groups`` (the
    optimizer's params; views into the flat buffers below). ``zero3.ds_tensor.frozen``: the
    ``ds_tensor`` of every other module param (partitions of frozen params: ceil(n/W) each).
    ``zero3.persistent_params``: full ``param.data`` of ``persistent_parameters`` (params under
    ``stage3_param_persistence_threshold``, kept whole on the device).
    ``zero3.fp16_partitioned_groups_flat``: the flat 16-bit partition per sub group.
    ``zero3.param_groups_fp16_flat_cpu_memory``: the (pinned) host buffer those are views of under
    offload_param. ``zero3.lp_param_buffer``: the defragmented device buffer without offload_param.
    ``zero3.fp32_partitioned_groups_flat``: fp32 master partitions.
    ``zero3.fp32_partitioned_groups_flat.grad``: their ``.grad`` (offload_optimizer: one buffer per
    sub group; otherwise None after initialize).
    ``zero3.grad_partitions_flat_buffer``: gradient partitions (gradient_accumulation_dtype).
    ``zero3.ipg_bucket.buffer``: reduce bucket(s), ``reduce_bucket_size`` elements per comm dtype.

ZeRO-1/2 (``DeepSpeedZeroOptimizer``, runtime/zero/stage_1_and_2.py)
    ``zero12.bit16_groups_flat``: full flat 16-bit copy of the trainable params (not partitioned;
    padded to a multiple of 2 x W elements). ``zero12.single_partition_of_fp32_groups``: fp32 master
    partition; ``zero12.single_partition_of_fp32_groups.grad``: its gradient (offload_optimizer).
    ``zero12.param_buffer_of_bit16_for_cpu_offload_groups``: 16-bit staging copy of the partition
    (offload_optimizer). ``zero12.temp_grad_buffer_for_cpu_offload``,
    ``zero12.temp_grad_buffer_for_gpu_offload``: largest-param-sized gradient staging buffers
    (offload_optimizer). ``zero12.grads_in_partition``, ``zero12.accumulated_grads_in_cpu``,
    ``zero12.averaged_gradients``: gradient partitions (live between backward and step).
    ``zero12.ipg_bucket.buffer``: reduce bucket buffers.

Optimizer state (``step``)
    ``optimizer.state.<name>`` summed over the basic optimizer's state tensors (``exp_avg``,
    ``exp_avg_sq`` for Adam; DeepSpeedCPUAdam creates them in Python at its first ``step``).
    ``optimizer.state.total``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from memfit.replay.measurement import AttributedItem


def _tensors(value, depth: int = 0) -> Iterator:
    import torch

    if value is None or depth > 3:
        return
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v, depth + 1)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v, depth + 1)
    elif hasattr(value, "buffer") and not isinstance(value, torch.nn.Module):
        yield from _tensors(value.buffer, depth + 1)


def item(key: str, at: str, tensors: Iterable) -> AttributedItem:
    """Sum ``tensors`` (each distinct tensor once) into one ``AttributedItem``."""
    seen = set()
    total = count = 0
    devices = set()
    pinned = set()
    for t in tensors:
        if t is None:
            continue
        ident = (str(t.device), t.data_ptr(), t.numel(), t.dtype)
        if ident in seen:
            continue
        seen.add(ident)
        total += t.numel() * t.element_size()
        count += 1
        devices.add(str(t.device))
        pinned.add(_is_pinned(t))
    device = "none" if not devices else devices.pop() if len(devices) == 1 else "mixed"
    pin = None if not pinned or None in pinned else (pinned.pop() if len(pinned) == 1 else None)
    return AttributedItem(key=key, at=at, bytes=total, count=count, device=device, pinned=pin)


def _is_pinned(t) -> bool | None:
    if t.device.type != "cpu" or t.numel() == 0:
        return None if t.device.type != "cpu" else False
    try:
        from deepspeed.accelerator import get_accelerator

        return bool(get_accelerator().is_pinned(t))
    except (ImportError, RuntimeError):
        return bool(t.is_pinned())


def logical_numel(param) -> int:
    """Elements of ``param`` as the model defines it (``ds_numel`` once zero.Init partitioned it)."""
    return int(getattr(param, "ds_numel", param.numel()))


def _logical_item(key: str, at: str, params: list) -> AttributedItem:
    if not any(hasattr(p, "ds_numel") for p in params):
        return item(key, at, params)
    sizes = sum(logical_numel(p) * p.element_size() for p in params)
    return AttributedItem(key=key, at=at, bytes=sizes, count=len(params), device="logical")


def model_items(model, at: str = "load") -> tuple[AttributedItem, ...]:
    """The model's params by trainability (logical sizes: full shapes even after zero.Init) and buffers;
    under zero.Init also ``load.ds_tensor``, the partitions it allocated."""
    params = list(model.parameters())
    out = [
        _logical_item("model.params", at, params),
        _logical_item("model.params.trainable", at, [p for p in params if p.requires_grad]),
        _logical_item("model.params.frozen", at, [p for p in params if not p.requires_grad]),
        item("model.buffers", at, list(model.buffers())),
    ]
    partitioned = [p.ds_tensor for p in params if hasattr(p, "ds_tensor")]
    if partitioned:
        out.append(item("load.ds_tensor", at, partitioned))
    return tuple(out)


def read_items(engine, *, at: str) -> tuple[AttributedItem, ...]:
    """Every known item of ``engine``'s optimizer that exists, read now."""
    opt = engine.optimizer
    out: list[AttributedItem] = []
    kind = type(opt).__name__
    if hasattr(opt, "fp16_partitioned_groups_flat"):  # ZeRO-3
        trainable = [p for group in getattr(opt, "fp16_groups", []) for p in group]
        trainable_ids = {id(p) for p in trainable}
        module_params = list(engine.module.parameters())
        out.append(item("zero3.ds_tensor.trainable", at, [p.ds_tensor for p in trainable if hasattr(p, "ds_tensor")]))
        out.append(item("zero3.ds_tensor.frozen", at, [p.ds_tensor for p in module_params
                                                      if id(p) not in trainable_ids and hasattr(p, "ds_tensor")]))
        persistent = getattr(opt, "persistent_parameters", None) or []
        out.append(item("zero3.persistent_params", at, [p.data for p in persistent]))
        for attr in ("fp16_partitioned_groups_flat", "param_groups_fp16_flat_cpu_memory", "lp_param_buffer",
                     "fp32_partitioned_groups_flat", "grad_partitions_flat_buffer"):
            if hasattr(opt, attr):
                out.append(item(f"zero3.{attr}", at, _tensors(getattr(opt, attr))))
        fp32 = getattr(opt, "fp32_partitioned_groups_flat", None) or []
        out.append(item("zero3.fp32_partitioned_groups_flat.grad", at, [t.grad for t in fp32]))
        buckets = getattr(opt, "ipg_buckets", None) or {}
        out.append(item("zero3.ipg_bucket.buffer", at, [b.buffer for b in buckets.values()]))
    elif hasattr(opt, "bit16_groups_flat"):  # ZeRO-1/2
        for attr in ("bit16_groups_flat", "single_partition_of_fp32_groups",
                     "param_buffer_of_bit16_for_cpu_offload_groups", "temp_grad_buffer_for_cpu_offload",
                     "temp_grad_buffer_for_gpu_offload", "grads_in_partition", "accumulated_grads_in_cpu",
                     "averaged_gradients"):
            if hasattr(opt, attr):
                out.append(item(f"zero12.{attr}", at, _tensors(getattr(opt, attr))))
        fp32 = getattr(opt, "single_partition_of_fp32_groups", None) or []
        out.append(item("zero12.single_partition_of_fp32_groups.grad", at, [t.grad for t in fp32]))
        buckets = getattr(opt, "ipg_buckets", None) or {}
        out.append(item("zero12.ipg_bucket.buffer", at, _tensors([b.buffer for b in buckets.values()])))
    basic = getattr(opt, "optimizer", None) if kind != "DeepSpeedZeRoOffload" else None
    if basic is None and hasattr(engine, "basic_optimizer"):
        basic = engine.basic_optimizer
    state = getattr(basic, "state", None)
    if state is not None:
        names: dict[str, list] = {}
        for per_param in state.values():
            for name, value in per_param.items():
                if hasattr(value, "numel") and value.dim() > 0:
                    names.setdefault(name, []).append(value)
        for name, tensors in sorted(names.items()):
            out.append(item(f"optimizer.state.{name}", at, tensors))
        out.append(item("optimizer.state.total", at, [t for ts in names.values() for t in ts]))
    return tuple(out)
