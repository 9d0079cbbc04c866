"""The limits a configuration must stay under with the user's headroom, and the check of a candidate
against them by the exact ledger (and of the fast estimate against the exact one), shared by the
DeepSpeed search (``search``) and the one for the other frameworks (``pytorch.search``).
"""

from __future__ import annotations

from memfit.core.hardware import Hardware
from memfit.core.ledger_types import Plan


def _limits(hw: Hardware, headroom: float) -> tuple[int, int, float]:
    """What a candidate may use: ``(1 - headroom)`` of the GPU (per rank), of the host RAM and of
    the NVMe space (per node; unlimited when the scenario gives none)."""
    nvme = hw.nvme_bytes * (1 - headroom) if hw.nvme_bytes is not None else float("inf")
    return int(hw.gpu.total_bytes * (1 - headroom)), int(hw.cpu_ram_bytes * (1 - headroom)), nvme


def _fits(plan: Plan, hw: Hardware, headroom: float) -> bool:
    """The exact plan's verdict figures (OOM-relevant GPU bytes, page-locked host bytes) with headroom."""
    from memfit.core.verdict import gpu_figure, host_figure

    gpu_limit, host_limit, nvme_limit = _limits(hw, headroom)
    return all(gpu_figure(p) <= gpu_limit and host_figure(p) <= host_limit
               and p.nvme_bytes * hw.gpus_per_node <= nvme_limit for p in plan.phases)


def _fast_exact_diff(peaks, plan: Plan) -> int:
    return max(max(abs(g - p.gpu_peak_bytes), abs(h - p.cpu_peak_bytes), abs(node - p.node_cpu_peak_bytes),
                   abs(nv - p.nvme_bytes)) for (g, h, node, nv), p in zip(peaks, plan.phases))
