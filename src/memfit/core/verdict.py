"""Compare each phase's peaks with the hardware: which phase fails first, where, by how much."""

from __future__ import annotations

from memfit.core.hardware import Hardware
from memfit.core.ledger_types import Failure, PhaseLedger, Verdict

GPU_OOM_RELEVANT = ("GPU OOM-relevant bytes: every segment holding a live block (allocated + stranded free space + "
                    "the new segment a request needs) + memory outside PyTorch (CUDA context, NCCL), per rank")
GPU_REQUESTED = "GPU bytes the live tensors hold (no allocator simulation), per rank"
HOST_LOCKED = "host RAM per node: pageable + page-locked pinned bytes (rounded, cached blocks included)"
HOST_REQUESTED = "host RAM per node: pageable + pinned bytes the tensors hold"


def judge(phases: tuple[PhaseLedger, ...], hw: Hardware) -> Verdict:
    """A phase fails when its per-rank GPU figure exceeds the card's capacity, or its per-node host
    figure exceeds the node's RAM, or its NVMe use exceeds the free NVMe space (when given).

    With the allocator simulators (CUDA runs) the GPU figure is the OOM-relevant one: a CUDA OOM is
    raised exactly when, after ``release_cached_blocks``, what cannot be released plus the new segment
    plus the memory outside PyTorch exceeds the card (``core/alloc/device_caching.py``). The host figure
    counts pinned memory as page-locked (power-of-two blocks, freed blocks kept cached)."""
    simulated = any(p.allocators_simulated for p in phases)
    gpu_fig, host_fig = (GPU_OOM_RELEVANT, HOST_LOCKED) if simulated else (GPU_REQUESTED, HOST_REQUESTED)
    failures = []
    for ph in phases:
        gpu = ph.gpu_oom_relevant_bytes if ph.allocators_simulated else ph.gpu_peak_bytes
        host = ph.node_cpu_locked_peak_bytes if ph.allocators_simulated else ph.node_cpu_peak_bytes
        if gpu > hw.gpu.total_bytes:
            failures.append(Failure(phase=ph.name, device="gpu", needed_bytes=gpu,
                                    available_bytes=hw.gpu.total_bytes, figure=gpu_fig))
        if host > hw.cpu_ram_bytes:
            failures.append(Failure(phase=ph.name, device="cpu", needed_bytes=host,
                                    available_bytes=hw.cpu_ram_bytes, figure=host_fig))
        if hw.nvme_bytes is not None and ph.nvme_bytes > hw.nvme_bytes:
            failures.append(Failure(phase=ph.name, device="nvme", needed_bytes=ph.nvme_bytes,
                                    available_bytes=hw.nvme_bytes, figure="NVMe bytes per rank"))
    return Verdict(fits=not failures, failures=tuple(failures), gpu_figure=gpu_fig, host_figure=host_fig)


def gpu_figure(ph: PhaseLedger) -> int:
    """The per-rank GPU bytes the verdict compares for this phase."""
    return ph.gpu_oom_relevant_bytes if ph.allocators_simulated else ph.gpu_peak_bytes


def host_figure(ph: PhaseLedger) -> int:
    """The per-node host bytes the verdict compares for this phase."""
    return ph.node_cpu_locked_peak_bytes if ph.allocators_simulated else ph.node_cpu_peak_bytes
