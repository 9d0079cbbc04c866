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
    ``stage3_param_persistence_threshold``, kept whole on the device): the storages of their
    gathered copies, padded to ceil(p/W) x W elements (the all-gather buffer ``param.data`` is a
    view of), except where it is the param's own partition (W = 1 on the device that holds the
    partition: no memory of its own).
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

Pinning, two ways per item: ``pinned_bytes`` is *measured*, the bytes whose storage went through the
accelerator's ``pin_memory``/``pin_empty`` (``PinRegistry``, fed by ``seams.record_pins``; the
storage object, not its address, so a freed and reused address is never mistaken for it);
``deepspeed_pins`` is *DeepSpeed's own decision*, read off the flags its allocation code tests
(DeepSpeed 0.19.8):

- ``zero3.ds_tensor.frozen`` (and ``load.ds_tensor``): ``partition_parameters.py:_partition_param``
  pins when the remote device is cpu and ``Init.pin_memory``; the engine's Init gets them from
  ``DeepSpeedZeRoOffload.offload_device``/``offload_param_pin_memory`` (parameter_offload.py).
- ``zero3.ds_tensor.trainable``, ``zero3.fp16_partitioned_groups_flat``,
  ``zero3.param_groups_fp16_flat_cpu_memory``: views of (or) the flat host buffer
  ``_create_param_groups_fp16_flat_cpu_memory`` always pins: ``optimizer.offload_param``.
- ``zero3.fp32_partitioned_groups_flat.grad``, ``zero3.grad_partitions_flat_buffer``:
  ``optimizer.offload_optimizer and optimizer.offload_optimizer_pin_memory``
  (``initialize_optimizer_states``, ``_setup_for_real_optimizer``).
- ``zero12.single_partition_of_fp32_groups`` and its ``.grad``,
  ``zero12.param_buffer_of_bit16_for_cpu_offload_groups``, ``zero12.temp_grad_buffer_for_cpu_offload``,
  ``zero12.accumulated_grads_in_cpu``: ``optimizer.cpu_offload and optimizer.cpu_offload_pin_memory``
  (stage_1_and_2.py ``__init__``, ``initialize_optimizer_states``, ``buffer_to_accumulate_to_in_cpu``).
- every other ZeRO buffer (device buffers, fp32 masters of ZeRO-3, buckets): False.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator

from memfit.replay.measurement import AttributedItem


class PinRegistry:
    """Storages DeepSpeed passed through the accelerator's pin functions, while they live.

    torch keeps one Python object per live storage (``t.untyped_storage()`` returns the same object
    for every view), so a weak reference to it identifies the storage for exactly its lifetime."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref] = {}

    def add(self, tensor) -> None:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, AttributeError):
            return
        key = id(storage)
        self._refs[key] = weakref.ref(storage, lambda _ref, key=key: self._refs.pop(key, None))

    def __contains__(self, tensor) -> bool:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, AttributeError):
            return False
        ref = self._refs.get(id(storage))
        return ref is not None and ref() is storage


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


def item(key: str, at: str, tensors: Iterable, *, pins: PinRegistry | None = None,
         deepspeed_pins: bool | None = None, storage: bool = False) -> AttributedItem:
    """Sum ``tensors`` (each distinct tensor once) into one ``AttributedItem``; ``pinned_bytes`` from
    ``pins`` (None without a registry). ``storage``: count each distinct storage's whole size
    instead (a view of a padded buffer holds all of it)."""
    seen = set()
    total = count = pinned_total = 0
    devices = set()
    pinned = set()
    for t in tensors:
        if t is None:
            continue
        if storage:
            ident = (str(t.device), t.untyped_storage().data_ptr())
            nbytes = t.untyped_storage().nbytes()
        else:
            ident = (str(t.device), t.data_ptr(), t.numel(), t.dtype)
            nbytes = t.numel() * t.element_size()
        if ident in seen:
            continue
        seen.add(ident)
        total += nbytes
        if pins is not None and t in pins:
            pinned_total += nbytes
        count += 1
        devices.add(str(t.device))
        pinned.add(_is_pinned(t))
    device = "none" if not devices else devices.pop() if len(devices) == 1 else "mixed"
    pin = None if not pinned or None in pinned else (pinned.pop() if len(pinned) == 1 else None)
    return AttributedItem(key=key, at=at, bytes=total, count=count, device=device, pinned=pin,
                          pinned_bytes=pinned_total if pins is not None else None, deepspeed_pins=deepspeed_pins)


def _is_pinned(t) -> bool | None:
    if t.device.type != "cpu" or t.numel() == 0:
        return None if t.device.type != "cpu" else False
    try:
        from deepspeed.accelerator import get_accelerator

        return bool(get_accelerator().is_pinned(t))
    except (ImportError, RuntimeError):
        return bool(t.is_pinned())


def _aliases_partition(param) -> bool:
    part = getattr(param, "ds_tensor", None)
    return part is not None and param.data.untyped_storage().data_ptr() == part.untyped_storage().data_ptr()


def logical_numel(param) -> int:
    """Elements of ``param`` as the model defines it (``ds_numel`` once zero.Init partitioned it)."""
    return int(getattr(param, "ds_numel", param.numel()))


def _logical_item(key: str, at: str, params: list, pins: PinRegistry | None) -> AttributedItem:
    if not any(hasattr(p, "ds_numel") for p in params):
        return item(key, at, params, pins=pins)
    sizes = sum(logical_numel(p) * p.element_size() for p in params)
    return AttributedItem(key=key, at=at, bytes=sizes, count=len(params), device="logical",
                          pinned_bytes=0 if pins is not None else None)


def _init_pins(ds_config: dict | None) -> bool | None:
    """zero.Init's ``pin_memory`` for the partitions it makes (partition_parameters.py
    ``Init.__init__``: offload_param's ``pin_memory`` when its remote device is cpu)."""
    if ds_config is None:
        return None
    off = ((ds_config.get("zero_optimization") or {}).get("offload_param") or {})
    return off.get("device") == "cpu" and bool(off.get("pin_memory", False))


def model_items(model, at: str = "load", *, pins: PinRegistry | None = None,
                ds_config: dict | None = None) -> tuple[AttributedItem, ...]:
    """The model's params by trainability (logical sizes: full shapes even after zero.Init) and buffers;
    under zero.Init also ``load.ds_tensor``, the partitions it allocated."""
    params = list(model.parameters())
    out = [
        _logical_item("model.params", at, params, pins),
        _logical_item("model.params.trainable", at, [p for p in params if p.requires_grad], pins),
        _logical_item("model.params.frozen", at, [p for p in params if not p.requires_grad], pins),
        item("model.buffers", at, list(model.buffers()), pins=pins),
    ]
    partitioned = [p.ds_tensor for p in params if hasattr(p, "ds_tensor")]
    if partitioned:
        out.append(item("load.ds_tensor", at, partitioned, pins=pins, deepspeed_pins=_init_pins(ds_config)))
    return tuple(out)


def read_items(engine, *, at: str, pins: PinRegistry | None = None) -> tuple[AttributedItem, ...]:
    """Every known item of ``engine``'s optimizer that exists, read now."""
    opt = engine.optimizer
    out: list[AttributedItem] = []
    kind = type(opt).__name__

    def add(key, tensors, flag=False, storage=False):
        out.append(item(key, at, tensors, pins=pins, deepspeed_pins=flag, storage=storage))

    if hasattr(opt, "fp16_partitioned_groups_flat"):  # ZeRO-3
        po = getattr(opt, "parameter_offload", None)
        part_pins = bool(po is not None and po.offload_device == "cpu" and po.offload_param_pin_memory)
        flat_pins = bool(opt.offload_param)
        grad_pins = bool(opt.offload_optimizer and opt.offload_optimizer_pin_memory)
        trainable = [p for group in getattr(opt, "fp16_groups", []) for p in group]
        trainable_ids = {id(p) for p in trainable}
        module_params = list(engine.module.parameters())
        add("zero3.ds_tensor.trainable", [p.ds_tensor for p in trainable if hasattr(p, "ds_tensor")], flat_pins)
        add("zero3.ds_tensor.frozen", [p.ds_tensor for p in module_params
                                       if id(p) not in trainable_ids and hasattr(p, "ds_tensor")], part_pins)
        persistent = getattr(opt, "persistent_parameters", None) or []
        # the memory the gathered copies hold: with W = 1 param.data can be the partition itself
        # (NoGatherHandle: ds_tensor.data.to(device), the same tensor when already on the device)
        # and each gathered param is a view of its all-gather buffer, padded to ceil(p/W) x W
        # (partition_parameters.py _allgather_param): count the buffers
        add("zero3.persistent_params", [p.data for p in persistent if not _aliases_partition(p)], storage=True)
        flags = {"fp16_partitioned_groups_flat": flat_pins, "param_groups_fp16_flat_cpu_memory": flat_pins,
                 "lp_param_buffer": False, "fp32_partitioned_groups_flat": False,
                 "grad_partitions_flat_buffer": grad_pins}
        for attr, flag in flags.items():
            if hasattr(opt, attr):
                add(f"zero3.{attr}", _tensors(getattr(opt, attr)), flag)
        fp32 = getattr(opt, "fp32_partitioned_groups_flat", None) or []
        add("zero3.fp32_partitioned_groups_flat.grad", [t.grad for t in fp32], grad_pins)
        buckets = getattr(opt, "ipg_buckets", None) or {}
        add("zero3.ipg_bucket.buffer", [b.buffer for b in buckets.values()])
    elif hasattr(opt, "bit16_groups_flat"):  # ZeRO-1/2
        host_pins = bool(opt.cpu_offload and opt.cpu_offload_pin_memory)
        flags = {"bit16_groups_flat": False, "single_partition_of_fp32_groups": host_pins,
                 "param_buffer_of_bit16_for_cpu_offload_groups": host_pins,
                 "temp_grad_buffer_for_cpu_offload": host_pins, "temp_grad_buffer_for_gpu_offload": False,
                 "grads_in_partition": False, "accumulated_grads_in_cpu": host_pins, "averaged_gradients": False}
        for attr, flag in flags.items():
            if hasattr(opt, attr):
                add(f"zero12.{attr}", _tensors(getattr(opt, attr)), flag)
        fp32 = getattr(opt, "single_partition_of_fp32_groups", None) or []
        add("zero12.single_partition_of_fp32_groups.grad", [t.grad for t in fp32], host_pins)
        buckets = getattr(opt, "ipg_buckets", None) or {}
        add("zero12.ipg_bucket.buffer", _tensors([b.buffer for b in buckets.values()]))
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
            out.append(item(f"optimizer.state.{name}", at, tensors, pins=pins))
        out.append(item("optimizer.state.total", at, [t for ts in names.values() for t in ts], pins=pins))
    return tuple(out)
