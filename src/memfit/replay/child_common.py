"""What both replay recipes share inside the child process (``child.ChildRun`` for DeepSpeed,
``pytorch.child.TorchChildRun`` for torch, DDP and FSDP): the launcher's environment, the error kind of
an exception, the injected faults, the device and library versions recorded, the model summary.

torch and the libraries are imported inside the functions: ``child`` imports this before it knows
which recipe runs.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from memfit.replay.measurement import DeviceInfo, ModelSummary
from memfit.replay.spec import ReplaySpec, parse_fault


MAX_TIMELINE_POINTS = 400
"""Timeline samples kept (every phase's first, last and peak samples survive; see ``downsample``)."""


def launcher_env(spec: ReplaySpec) -> dict[str, str]:
    """Environment variables a launcher would set for rank ``spec.rank`` (torchrun: it set them)."""
    if spec.launcher == "torchrun":
        return {"DS_ACCELERATOR": spec.accelerator}
    return {
        "DS_ACCELERATOR": spec.accelerator,
        "LOCAL_RANK": "0",
        "RANK": str(spec.rank),
        "WORLD_SIZE": str(spec.world_size),
        "LOCAL_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29517",
    }


def classify(exc: BaseException) -> str:
    """``ReplayError.kind`` of an exception."""
    from memfit.replay.ops import BuildLockError

    if isinstance(exc, BuildLockError):
        return exc.kind
    import torch

    message = str(exc)
    if isinstance(exc, getattr(torch, "OutOfMemoryError", ())) and "DefaultCPUAllocator" not in message:
        return "oom"
    if isinstance(exc, MemoryError) or "DefaultCPUAllocator: can't allocate memory" in message:
        return "host_oom"
    if "out of memory" in message.lower():
        return "oom"
    return "error"


def _fault_hook(spec: ReplaySpec):
    phase, kind, rank = parse_fault(spec.fault or "")

    def hook(name: str) -> None:
        if name != phase or rank not in (None, spec.rank):
            return
        import torch

        if kind == "raise":
            raise RuntimeError(f"memfit injected fault at {name}")
        if kind == "oom":
            device = "cuda" if spec.accelerator == "cuda" else "cpu"
            torch.empty(2**62, dtype=torch.uint8, device=device)
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "hang":
            time.sleep(10**6)

    return hook


def _device_info(spec: ReplaySpec, index: int = 0) -> DeviceInfo:
    import torch

    host_ram = 0
    cpu_name = "cpu"
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    host_ram = int(line.split()[1]) * 1024
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu_name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    if spec.accelerator == "cuda":
        return DeviceInfo(accelerator="cuda", name=torch.cuda.get_device_name(index),
                          total_bytes=int(torch.cuda.mem_get_info(index)[1]),
                          capacity_bytes=spec.emulate_capacity_bytes, cpu_count=os.cpu_count() or 0,
                          host_ram_bytes=host_ram)
    return DeviceInfo(accelerator="cpu", name=cpu_name, total_bytes=host_ram, cpu_count=os.cpu_count() or 0,
                      host_ram_bytes=host_ram)


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": sys.version.split()[0]}
    for name in ("torch", "deepspeed", "transformers", "peft", "memfit"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "missing"
    return out


def _model_summary(model, cfg) -> ModelSummary:
    from memfit.replay.deepspeed.attribution import logical_numel
    from memfit.replay.model_build import num_layers

    named = [(n, p, logical_numel(p)) for n, p in model.named_parameters()]
    largest_name, _, largest = max(named, key=lambda x: x[2])
    return ModelSummary(
        architecture=type(getattr(model, "get_base_model", lambda: model)()).__name__,
        params=sum(n for _, _, n in named),
        trainable_params=sum(n for _, p, n in named if p.requires_grad),
        param_bytes=sum(n * p.element_size() for _, p, n in named),
        trainable_param_bytes=sum(n * p.element_size() for _, p, n in named if p.requires_grad),
        buffer_bytes=sum(b.numel() * b.element_size() for b in model.buffers()),
        largest_param=largest,
        largest_param_name=largest_name,
        num_layers=num_layers(cfg),
    )


STEP_PHASES = ("forward", "backward", "optimizer_step")
LOOP_PHASES = (*STEP_PHASES, *(f"{p}.{n}" for p in ("accum", "step2") for n in STEP_PHASES))
"""Phase names of the training loop: the DeepSpeed child names every occurrence by its step name and
numbers it; the torch child names them as the ledger does."""


def step_alloc_sequence(spec: ReplaySpec, recorder, tracker):  # noqa: ANN001 (PhaseRecorder, HostTracker)
    """The training loop's allocation sequence (``spec.alloc_sequence``): the windows from the first
    forward to the last optimizer step, labelled with ledger phase names (``sequence_phase``; where a
    label recurs, the micro-steps of a later step under gradient accumulation, the last occurrence is
    the ledger's phase and the earlier ones are ``label#k``). None when not asked for or not tracked."""
    from memfit.replay.host_tracker import alloc_sequence
    from memfit.replay.measurement import sequence_phase

    if not spec.alloc_sequence or tracker.raw is None:
        return None
    rows = [(w, r) for w, r in recorder.closed if r.name in LOOP_PHASES]
    if not rows:
        return None
    first = recorder.closed.index(rows[0])
    last = recorder.closed.index(rows[-1])
    rows = recorder.closed[first:last + 1]
    labels = [sequence_phase(r.name, r.step, r.micro_step) if r.name in STEP_PHASES else r.name for _, r in rows]
    windows, seen = [], {}
    for (w, _), label in zip(rows, labels):
        seen[label] = seen.get(label, 0) + 1
        later = labels.count(label) - seen[label]
        windows.append((label if not later else f"{label}#{seen[label]}", w))
    events, marks, pins = tracker.raw
    return alloc_sequence(events, marks, pins, windows)
