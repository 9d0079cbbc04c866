"""Compare each phase's peaks with the hardware: which phase fails first, where, by how much."""

from __future__ import annotations

from memfit.core.hardware import Hardware
from memfit.core.ledger_types import Failure, PhaseLedger, Verdict


def judge(phases: tuple[PhaseLedger, ...], hw: Hardware) -> Verdict:
    """A phase fails when its per-rank GPU peak exceeds the card's capacity, or its per-node host
    peak exceeds the node's RAM, or its NVMe use exceeds the free NVMe space (when given)."""
    failures = []
    for ph in phases:
        if ph.gpu_peak_bytes > hw.gpu.total_bytes:
            failures.append(Failure(phase=ph.name, device="gpu", needed_bytes=ph.gpu_peak_bytes,
                                    available_bytes=hw.gpu.total_bytes))
        if ph.node_cpu_peak_bytes > hw.cpu_ram_bytes:
            failures.append(Failure(phase=ph.name, device="cpu", needed_bytes=ph.node_cpu_peak_bytes,
                                    available_bytes=hw.cpu_ram_bytes))
        if hw.nvme_bytes is not None and ph.nvme_bytes > hw.nvme_bytes:
            failures.append(Failure(phase=ph.name, device="nvme", needed_bytes=ph.nvme_bytes,
                                    available_bytes=hw.nvme_bytes))
    return Verdict(fits=not failures, failures=tuple(failures))
