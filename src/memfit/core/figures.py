"""The figures memfit reports, one name each, used by every output (plan, recommend, compare,
diagnose, the reports, ``memfit.check``): the verdict's figure, labelled as such, and its named
companions.

Glossary (the names as printed):

- **GPU OOM-relevant peak** (per rank): the verdict's GPU figure when torch's caching allocator is
  simulated (every CUDA scenario): every segment holding a live block + the segment a request needs
  + memory outside PyTorch (``PhaseLedger.gpu_oom_relevant_bytes``). A CUDA OOM is raised exactly
  when it exceeds the card.
- **GPU requested peak** (per rank): the bytes the live tensors ask for plus the memory outside
  PyTorch (CUDA context, NCCL), no allocator simulated (``gpu_peak_bytes``); the verdict's figure on
  DeepSpeed's CPU accelerator, a companion otherwise.
- **GPU allocated peak**: torch's ``max_memory_allocated`` (512-B blocks).
- **GPU reserved peak**: torch's ``max_memory_reserved`` (cached segments).
- **nvidia-smi estimate**: reserved + memory outside PyTorch, what nvidia-smi would show.
- **host RAM peak per node** (all ranks of a node): the verdict's host figure, pageable + page-locked
  pinned bytes (rounded blocks, cached ones included) where the pinned allocator is simulated,
  pageable + pinned requested bytes otherwise.
- **host RAM peak per rank**: the same for one process.

Each figure is the largest over the run's phases, with the phase it peaks in. Pure: no torch.
"""

from __future__ import annotations


from memfit.core.lean_dataclass import dataclass
from memfit.core.ledger_types import Failure, PhaseLedger, Plan

GPU_OOM_RELEVANT = "GPU OOM-relevant peak"
GPU_TENSORS = "GPU requested peak"
GPU_ALLOCATED = "GPU allocated peak"
GPU_RESERVED = "GPU reserved peak"
GPU_NVIDIA_SMI = "nvidia-smi estimate"
HOST_NODE = "host RAM peak per node"
HOST_RANK = "host RAM peak per rank"
NVME = "NVMe peak per rank"

VERDICT_TAG = "the verdict's figure"
"""How every output marks the figure the verdict compares with the hardware."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Figure:
    """One named figure: its largest value over the run and the phase it is reached in."""

    name: str
    """One of this module's names (``GPU_OOM_RELEVANT`` ...)."""
    bytes: int
    phase: str
    scope: str
    """``per rank`` or ``per node``."""
    verdict: bool = False
    """The figure the verdict compares with the hardware."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Headline:
    """A plan's figures: the verdict's GPU and host figures and their companions."""

    gpu: Figure
    host: Figure
    gpu_companions: tuple[Figure, ...]
    """GPU requested/allocated/reserved peaks and the nvidia-smi estimate (those the plan has)."""
    host_companions: tuple[Figure, ...]

    @property
    def all(self) -> tuple[Figure, ...]:
        return (self.gpu, *self.gpu_companions, self.host, *self.host_companions)


def simulated(plan: Plan) -> bool:
    return any(p.allocators_simulated for p in plan.phases)


def gpu_verdict_bytes(ph: PhaseLedger) -> int:
    """The per-rank GPU bytes the verdict compares for one phase (``verdict.gpu_figure``)."""
    return ph.gpu_oom_relevant_bytes if ph.allocators_simulated else ph.gpu_peak_bytes


def host_verdict_bytes(ph: PhaseLedger) -> int:
    """The per-node host bytes the verdict compares for one phase (``verdict.host_figure``)."""
    return ph.node_cpu_locked_peak_bytes if ph.allocators_simulated else ph.node_cpu_peak_bytes


def gpu_verdict_name(plan: Plan) -> str:
    return GPU_OOM_RELEVANT if simulated(plan) else GPU_TENSORS


def _peak(plan: Plan, name: str, scope: str, value, verdict: bool = False) -> Figure:
    ph = max(plan.phases, key=value)  # the first phase reaching the maximum
    return Figure(name=name, bytes=value(ph), phase=ph.name, scope=scope, verdict=verdict)


def headline(plan: Plan) -> Headline:
    """The plan's named figures (see the module docstring)."""
    sim = simulated(plan)
    gpu = _peak(plan, gpu_verdict_name(plan), "per rank", gpu_verdict_bytes, verdict=True)
    host = _peak(plan, HOST_NODE, "per node", host_verdict_bytes, verdict=True)
    companions = []
    if sim:
        companions += [_peak(plan, GPU_TENSORS, "per rank", lambda p: p.gpu_peak_bytes),
                       _peak(plan, GPU_ALLOCATED, "per rank", lambda p: p.gpu_allocated_bytes),
                       _peak(plan, GPU_RESERVED, "per rank", lambda p: p.gpu_reserved_bytes),
                       _peak(plan, GPU_NVIDIA_SMI, "per rank", lambda p: p.gpu_nvidia_smi_bytes)]
    rank = _peak(plan, HOST_RANK, "per rank",
                 (lambda p: p.cpu_locked_peak_bytes) if sim else (lambda p: p.cpu_peak_bytes))
    hc = [rank]
    if any(p.nvme_bytes for p in plan.phases):
        hc.append(_peak(plan, NVME, "per rank", lambda p: p.nvme_bytes))
    return Headline(gpu=gpu, host=host, gpu_companions=tuple(companions), host_companions=tuple(hc))


def failure_figure_name(plan: Plan, f: Failure) -> str:
    """The name of the figure a failure compared."""
    return {"gpu": gpu_verdict_name(plan), "cpu": HOST_NODE, "nvme": NVME}[f.device]
