"""Compare each phase's peaks with the hardware: fits, at risk or does not fit; which phase fails
first, which fails worst, where, by how much.

Three levels (issue 19):

- **does not fit**: a phase's GPU figure exceeds the card (per rank), its host figure the node's
  RAM, or its NVMe use the free NVMe space;
- **at risk**: every phase fits on paper, but one is within memfit's measured error of a limit:
  its GPU figure x (1 + GPU margin) exceeds the card, or its host figure x (1 + host margin) plus
  the reserve for the OS exceeds the node's RAM; or the card is shared with other processes
  (``--shared-gpu``), whose memory memfit cannot know; or, with swap given (``--swap``), a phase's
  host figure exceeds the RAM but not RAM + swap while its page-locked bytes fit in the RAM (the
  kernel pages pageable memory out; pinned pages stay: ``cudaHostAlloc`` locks them);
- **fits**: neither.

The margins are not constants chosen here: ``verdict_margin.json`` holds them as measured on the
published GPU runs of ``tests/fixtures/public_runs/`` (``core/compare/accuracy.py:derive_margins``;
``benchmarks/accuracy.py --write-margin`` writes the file and a test checks it still equals what the
corpus gives). The host reserve is the one a documented node agent keeps for the OS and system
daemons (``host_reserve_bytes``); ``--host-reserve`` replaces it.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from memfit.core.hardware import Hardware
from memfit.core.ledger_types import Failure, PhaseLedger, Risk, Verdict
from memfit.core.units import fmt_bytes

GPU_OOM_RELEVANT = ("GPU OOM-relevant bytes: every segment holding a live block (allocated + stranded free space + "
                    "the new segment a request needs) + memory outside PyTorch (CUDA context, NCCL), per rank")
GPU_REQUESTED = "GPU bytes the live tensors hold (no allocator simulation), per rank"
HOST_LOCKED = "host RAM per node: pageable + page-locked pinned bytes (rounded, cached blocks included)"
HOST_REQUESTED = "host RAM per node: pageable + pinned bytes the tensors hold"
PINNED_NODE = "page-locked (pinned) host bytes per node, which swap cannot take (per rank x ranks on the node)"

MARGIN_FILE = Path(__file__).with_name("verdict_margin.json")
MiB = 2**20
HOST_RESERVE_FIXED = 330 * MiB + 100 * MiB
HOST_RESERVE_FRACTION = 0.05
HOST_RESERVE_SOURCE = ("330 MiB + 5% of RAM for the OS and system daemons, + a 100 MiB eviction threshold "
                       "(Google Distributed Cloud 1.15, 'Resources available for your workloads': "
                       "https://cloud.google.com/anthos/clusters/docs/on-prem/1.15/how-to/resources-available-pods)")


@lru_cache(maxsize=1)
def margins() -> dict:
    """The measured margins (``verdict_margin.json``): ``{"gpu": {"margin": ...}, "host": {...}, ...}``."""
    return json.loads(MARGIN_FILE.read_text(encoding="utf-8"))


def host_reserve_bytes(ram: int) -> int:
    """RAM a node keeps for its OS and daemons (``HOST_RESERVE_SOURCE``)."""
    return HOST_RESERVE_FIXED + int(ram * HOST_RESERVE_FRACTION)


def node_reserve(hw: Hardware) -> int:
    """Host RAM per node the verdict keeps for the OS: ``--host-reserve``, else ``host_reserve_bytes``."""
    return host_reserve_bytes(hw.cpu_ram_bytes) if hw.host_reserve_bytes is None else hw.host_reserve_bytes


def fit_limits(hw: Hardware) -> tuple[int, int]:
    """``(GPU bytes per rank, host bytes per node)`` a phase may reach and still be called "fits":
    the card / (1 + GPU margin); (the node's RAM - the OS reserve) / (1 + host margin). ``recommend``
    keeps its candidates under the same limits unless ``--headroom`` says otherwise."""
    m = margins()
    gm, hm = float(m["gpu"]["margin"]), float(m["host"]["margin"])
    return int(hw.gpu.total_bytes / (1 + gm)), int(max(hw.cpu_ram_bytes - node_reserve(hw), 0) / (1 + hm))


def judge(phases: tuple[PhaseLedger, ...], hw: Hardware) -> Verdict:
    """A phase fails when its per-rank GPU figure exceeds the card's capacity, or its per-node host
    figure exceeds the node's RAM, or its NVMe use exceeds the free NVMe space (when given); it is at
    risk when it fits within the margins of the module docstring.

    With the allocator simulators (CUDA runs) the GPU figure is the OOM-relevant one: a CUDA OOM is
    raised exactly when, after ``release_cached_blocks``, what cannot be released plus the new segment
    plus the memory outside PyTorch exceeds the card (``core/alloc/device_caching.py``). The host figure
    counts pinned memory as page-locked (power-of-two blocks, freed blocks kept cached)."""
    simulated = any(p.allocators_simulated for p in phases)
    gpu_fig, host_fig = (GPU_OOM_RELEVANT, HOST_LOCKED) if simulated else (GPU_REQUESTED, HOST_REQUESTED)
    m = margins()
    gm, hm = float(m["gpu"]["margin"]), float(m["host"]["margin"])
    reserve = node_reserve(hw)
    shared_gpu = hw.shared_gpu
    cap, ram, swap = hw.gpu.total_bytes, hw.cpu_ram_bytes, hw.swap_bytes
    gpu_limit, host_limit = fit_limits(hw)
    failures, risks = [], []
    for ph in phases:
        gpu = ph.gpu_oom_relevant_bytes if ph.allocators_simulated else ph.gpu_peak_bytes
        host = ph.node_cpu_locked_peak_bytes if ph.allocators_simulated else ph.node_cpu_peak_bytes
        if gpu > cap:
            failures.append(Failure(phase=ph.name, device="gpu", needed_bytes=gpu, available_bytes=cap, figure=gpu_fig))
        elif gpu > gpu_limit:
            risks.append(Risk(phase=ph.name, device="gpu", needed_bytes=gpu, available_bytes=cap, limit_bytes=gpu_limit,
                              why=f"within memfit's measured GPU error ({gm:.0%}) of the card"))
        locked = (ph.cpu_pinned_locked_bytes if ph.allocators_simulated else ph.cpu_pinned_bytes) * ph.ranks_per_node
        if host > ram + swap:
            failures.append(Failure(phase=ph.name, device="cpu", needed_bytes=host, available_bytes=ram + swap,
                                    figure=host_fig + (f", against RAM + {fmt_bytes(swap)} of swap" if swap else "")))
        elif host > ram and locked > ram:
            failures.append(Failure(phase=ph.name, device="cpu", needed_bytes=locked, available_bytes=ram,
                                    figure=PINNED_NODE))
        elif host > ram:
            risks.append(Risk(phase=ph.name, device="cpu", needed_bytes=host, available_bytes=ram, limit_bytes=ram,
                              why=f"{fmt_bytes(host - ram)} more than the node's RAM: it runs only by paging that "
                                  f"much pageable memory out to the {fmt_bytes(swap)} of swap (slow; the "
                                  f"{fmt_bytes(locked)} page-locked stay in RAM)"))
        elif host > host_limit:
            risks.append(Risk(phase=ph.name, device="cpu", needed_bytes=host, available_bytes=ram, limit_bytes=host_limit,
                              why=f"within memfit's measured host error ({hm:.0%}) plus {fmt_bytes(reserve, 'GB')} "
                                  "kept for the OS of the node's RAM"))
        if hw.nvme_bytes is not None and ph.nvme_bytes > hw.nvme_bytes:
            failures.append(Failure(phase=ph.name, device="nvme", needed_bytes=ph.nvme_bytes,
                                    available_bytes=hw.nvme_bytes, figure="NVMe bytes per rank"))
    if shared_gpu and not any(r.device == "gpu" for r in risks):
        worst = max(phases, key=gpu_figure)
        risks.append(Risk(phase=worst.name, device="gpu", needed_bytes=gpu_figure(worst), available_bytes=cap,
                          limit_bytes=gpu_limit, why="the card is shared (--shared-gpu): other processes' memory "
                                                     "on it is not known"))
    level = "does_not_fit" if failures else "at_risk" if risks else "fits"
    return Verdict(fits=not failures, failures=tuple(failures), gpu_figure=gpu_fig, host_figure=host_fig,
                   level=level, risks=tuple(risks), gpu_margin=gm, host_margin=hm, host_reserve_bytes=reserve,
                   shared_gpu=shared_gpu, margin_source=str(m.get("source", "")))


def gpu_figure(ph: PhaseLedger) -> int:
    """The per-rank GPU bytes the verdict compares for this phase."""
    return ph.gpu_oom_relevant_bytes if ph.allocators_simulated else ph.gpu_peak_bytes


def host_figure(ph: PhaseLedger) -> int:
    """The per-node host bytes the verdict compares for this phase."""
    return ph.node_cpu_locked_peak_bytes if ph.allocators_simulated else ph.node_cpu_peak_bytes


def level_words(v: Verdict) -> str:
    """The verdict's level as the terminal, the reports and ``check`` print it."""
    return {"fits": "FITS", "at_risk": "AT RISK", "does_not_fit": "DOES NOT FIT"}[v.level]
