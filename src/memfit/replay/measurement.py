"""What a replay measured: memory per phase, sizes read off DeepSpeed's objects, errors.

Glossary (all sizes are bytes, per process = per rank):

- *host live*: bytes of host tensor storages alive at an instant, from the allocator's own
  allocation and free reports (torch.profiler memory events: ``c10::reportMemoryUsageToProfiler``
  in the CPU allocator; exact requested sizes, counted from the start of the child, before the
  model is built). On the ``cpu`` accelerator this includes what DeepSpeed treats as the device.
- *pinned*: host storages DeepSpeed passed through ``get_accelerator().pin_memory`` (page-locked on
  CUDA; on the CPU accelerator nothing is page-locked, so these are the bytes DeepSpeed *would*
  pin: the ledger's ``cpu_pinned`` items). *pageable* is the rest of host live.
- *RSS*: the process's resident set (``/proc/self/status`` VmRSS; the phase peak is VmHWM after
  resetting it at the phase start through ``/proc/self/clear_refs``). Includes libraries, the
  Python heap and the profiler's own buffers, so it is larger than host live.
- *device allocated/reserved*: ``torch.cuda.max_memory_allocated``/``max_memory_reserved`` with the
  peaks reset at each phase start (cuda only; ``None`` on cpu).

``Measurement`` round-trips through JSON (``to_json``/``from_json``) and is what fixtures store.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memfit.core.alloc.sequence import AllocSequence
from memfit.errors import MemfitError
from memfit.replay.spec import ReplaySpec

ERROR_KINDS = ("oom", "host_oom", "error", "killed", "timeout", "crash", "build_lock", "build_lock_timeout")
"""``oom``: the device allocator failed (``torch.OutOfMemoryError`` or "CUDA error: out of memory",
which is also how a failed pinned host allocation surfaces); ``host_oom``: the CPU allocator failed
("DefaultCPUAllocator: can't allocate memory", ``MemoryError``); ``error``: any other exception;
``killed``: the child died of a signal (e.g. the kernel's OOM killer's SIGKILL); ``timeout``: the
parent killed it at the deadline; ``crash``: it exited non-zero without reporting; ``build_lock``: a
DeepSpeed op's build lock is stale (held by no live process); ``build_lock_timeout``: another
process held that lock longer than the child may wait (``memfit.replay.ops``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseMeasurement:
    """Memory over one phase (one occurrence: step phases repeat once per micro-step)."""

    name: str
    """One of ``memfit.core.ledger_types.PHASES``."""
    step: int | None = None
    """Optimizer step (0-based) for forward/backward/optimizer_step; None otherwise."""
    micro_step: int | None = None
    """Micro-step within the step (gradient accumulation), for forward/backward/optimizer_step."""
    start_s: float
    end_s: float
    """Seconds since the child started."""
    completed: bool = True
    """False when the run failed inside this phase."""
    host_live_start_bytes: int | None = None
    host_live_end_bytes: int | None = None
    host_peak_bytes: int | None = None
    """Highest host live during the phase."""
    host_peak_pinned_bytes: int | None = None
    """Pinned part of host live at the moment of ``host_peak_bytes``."""
    host_peak_pageable_bytes: int | None = None
    host_pinned_end_bytes: int | None = None
    host_max_pinned_bytes: int | None = None
    """Highest pinned live during the phase (need not coincide with the host peak)."""
    rss_start_bytes: int | None = None
    rss_end_bytes: int | None = None
    rss_peak_bytes: int | None = None
    device_allocated_start_bytes: int | None = None
    device_allocated_end_bytes: int | None = None
    device_peak_allocated_bytes: int | None = None
    device_peak_reserved_bytes: int | None = None
    device_reserved_end_bytes: int | None = None
    """cuda: ``torch.cuda.memory_reserved()`` at the phase end."""
    device_num_ooms: int | None = None
    """Allocator OOMs during the phase (``memory_stats()["num_ooms"]`` difference)."""
    device_num_alloc_retries: int | None = None
    """cudaMalloc retries after freeing the cache during the phase."""
    device_driver_used_end_bytes: int | None = None
    """cuda: ``total - free`` from ``torch.cuda.mem_get_info()`` at the phase end: everything the
    driver has handed out on the card (this process's CUDA context and reserved blocks, and any
    other process)."""
    cuda_host_peak_bytes: int | None = None
    """cuda: peak of torch's pinned-memory caching allocator (``torch.cuda.host_memory_stats``,
    ``allocated_bytes.peak``: blocks in use plus cached, at their rounded size)."""
    cuda_host_end_bytes: int | None = None
    """cuda: ``host_memory_stats()["allocated_bytes.current"]`` at the phase end."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TimelinePoint:
    t_s: float
    """Seconds since the child started."""
    phase: str
    host_live_bytes: int
    host_pinned_bytes: int
    device_allocated_bytes: int | None = None
    """From the profiler's device allocation events (caching-allocator block sizes); None on cpu."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AttributedItem:
    """A size read directly off a DeepSpeed (or torch/peft) object, to match a ledger item.

    Keys are documented in ``memfit.replay.deepspeed.attribution``.
    """

    key: str
    at: str
    """When it was read: ``initialize`` (right after ``deepspeed.initialize``), ``step`` (after the
    first optimizer step) or ``load`` (after the model is built)."""
    bytes: int
    """Sum of ``numel x element_size`` over the tensors, each storage counted once."""
    count: int
    """Number of tensors summed."""
    device: str
    """``cpu``, ``cuda:0``, ``mixed``, ``none`` (no tensor) or ``logical`` (model params that
    zero.Init partitioned at load: the bytes are their full, defined size)."""
    pinned: bool | None = None
    """Whether the accelerator reports the tensors pinned (``is_pinned``: page-locked; on the cpu
    accelerator never, so see ``pinned_bytes``)."""
    pinned_bytes: int | None = None
    """Bytes of these tensors whose storage DeepSpeed passed through the accelerator's
    ``pin_memory``/``pin_empty`` (the replay's ``record_pins`` seam; on CUDA the page-locked ones,
    on the cpu accelerator the ones DeepSpeed *would* page-lock). None in fixtures recorded before
    this field existed."""
    deepspeed_pins: bool | None = None
    """Whether DeepSpeed's code pins these tensors, read off the flags its allocation code decides
    by (``memfit.replay.deepspeed.attribution``, e.g. ``offload_optimizer_pin_memory``); None where no such
    flag applies (the model, optimizer states: never pinned)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayError:
    phase: str | None
    """The phase the run was in when it failed (None: before the first phase)."""
    kind: str
    """One of ``ERROR_KINDS``."""
    message: str
    traceback: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceInfo:
    accelerator: str
    name: str
    """GPU name, or the CPU model."""
    total_bytes: int
    """cuda: ``torch.cuda.mem_get_info()[1]``; cpu: MemTotal of the host."""
    capacity_bytes: int | None = None
    """cuda with emulation: the emulated capacity the allocator was capped at."""
    cpu_count: int = 0
    host_ram_bytes: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSummary:
    """The built model as ``named_parameters()`` reports it after PEFT (before DeepSpeed)."""

    architecture: str
    params: int
    trainable_params: int
    param_bytes: int
    """Sum of ``numel x element_size`` over parameters (each parameter once)."""
    trainable_param_bytes: int
    buffer_bytes: int
    largest_param: int
    largest_param_name: str
    num_layers: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """One replay's result."""

    spec: ReplaySpec
    deepspeed_config_used: dict[str, Any]
    """The JSON actually handed to ``deepspeed.initialize`` (batch sizes set, substitutions made)."""
    substitutions: tuple[str, ...] = ()
    """Changes to the recipe the accelerator forced, e.g. ``fp16->bf16: cpu accelerator has no
    fp16`` (same bytes per element; recorded so comparisons can account for it)."""
    device: DeviceInfo | None = None
    versions: dict[str, str]
    command: str
    model: ModelSummary | None = None
    phases: tuple[PhaseMeasurement, ...] = ()
    attributed: tuple[AttributedItem, ...] = ()
    timeline: tuple[TimelinePoint, ...] = ()
    losses: tuple[float | None, ...] = ()
    """Loss of every micro-step (None where not finite)."""
    skipped_steps: int = 0
    """Optimizer steps the fp16 loss scaler skipped for overflow (``engine.skipped_steps``): a
    skipped step allocates no optimizer state, so its memory is not representative."""
    error: ReplayError | None = None
    wall_s: float = 0.0
    returncode: int | None = None
    notes: tuple[str, ...] = ()
    alloc_sequence: AllocSequence | None = None
    """With ``spec.alloc_sequence``: every host tensor the CPU allocator reported from the first
    forward to the end of the last optimizer step (``memfit.replay.host_tracker.alloc_sequence``);
    its marks are ledger phase names (``sequence_phase``)."""

    @property
    def ok(self) -> bool:
        return self.error is None

    def phase_occurrences(self, name: str) -> tuple[PhaseMeasurement, ...]:
        return tuple(p for p in self.phases if p.name == name)

    def phase(self, name: str, step: int | None = None, micro_step: int | None = None) -> PhaseMeasurement:
        """The phase ``name`` (for step phases: of ``step``/``micro_step``, default the first)."""
        for p in self.phases:
            if p.name == name and (step is None or p.step == step) and (micro_step is None or p.micro_step == micro_step):
                return p
        raise KeyError(name if step is None else f"{name}[step {step}]")

    def peak(self, name: str, field: str) -> int | None:
        """Highest ``field`` (e.g. ``host_peak_bytes``) over every occurrence of phase ``name``."""
        values = [getattr(p, field) for p in self.phase_occurrences(name) if getattr(p, field) is not None]
        return max(values) if values else None

    def items(self, at: str = "initialize") -> dict[str, int]:
        """``key -> bytes`` of the attributed items read at ``at``."""
        return {i.key: i.bytes for i in self.attributed if i.at == at}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "spec":
                out[f.name] = value.to_dict()
            elif f.name == "alloc_sequence":
                if value is not None:
                    out[f.name] = value.to_dict()
            else:
                out[f.name] = _to_plain(value)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measurement:
        d = dict(data)
        d["spec"] = ReplaySpec.from_dict(d["spec"])
        d["substitutions"] = tuple(d.get("substitutions", ()))
        d["notes"] = tuple(d.get("notes", ()))
        d["losses"] = tuple(d.get("losses", ()))
        d["device"] = DeviceInfo(**d["device"]) if d.get("device") else None
        d["model"] = ModelSummary(**d["model"]) if d.get("model") else None
        d["phases"] = tuple(PhaseMeasurement(**p) for p in d.get("phases", ()))
        d["attributed"] = tuple(AttributedItem(**a) for a in d.get("attributed", ()))
        d["timeline"] = tuple(TimelinePoint(**t) for t in d.get("timeline", ()))
        d["error"] = ReplayError(**d["error"]) if d.get("error") else None
        d["alloc_sequence"] = AllocSequence.from_dict(d["alloc_sequence"]) if d.get("alloc_sequence") else None
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Measurement:
        return cls.from_dict(json.loads(text))


def sequence_phase(name: str, step: int | None, micro_step: int | None) -> str:
    """The ledger phase a replay's step phase occurrence is: step 1's first micro-step is ``forward``/
    ``backward``, its later ones ``accum.*``; every later step is ``step2.*``."""
    if not step:
        return name if not micro_step or name == "optimizer_step" else f"accum.{name}"
    return f"step2.{name}"


def save_fixture(measurement: Measurement, path: str, *, overwrite: bool = False) -> str:
    """Write ``measurement`` as JSON to ``path``; refuse to replace an existing file unless told to,
    and never write through a symbolic link (memfit's one writer, ``memfit.core.writing``)."""
    from memfit.core.writing import write_file

    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        raise MemfitError(f"fixture: cannot create {parent}: {e.strerror or type(e).__name__}") from None
    write_file(path, measurement.to_json() + "\n", what="fixture", overwrite=overwrite,
               exists_hint="pass overwrite=True (--overwrite) to replace it")
    return path


def load_fixture(path: str) -> Measurement:
    with open(path, encoding="utf-8") as fh:
        return Measurement.from_json(fh.read())


def rank_output_path(out_path: str, rank: int) -> str:
    """Where rank ``rank`` writes its measurement: ``out_path`` for rank 0, ``OUT.rankR.json`` else."""
    if rank == 0:
        return out_path
    root, ext = os.path.splitext(out_path)
    return f"{root}.rank{rank}{ext}"


def _to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    return value

