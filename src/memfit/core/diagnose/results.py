"""``memfit diagnose``'s typed results: the events a log holds and the diagnosis (see the package
docstring for the glossary)."""

from __future__ import annotations

from enum import Enum

from memfit.core.lean_dataclass import dataclass
from memfit.core.ledger_types import Failure, Finding, LedgerItem

GiB = 2**30


class EventKind(str, Enum):
    GPU_OOM = "gpu_oom"
    """PyTorch's caching allocator: ``CUDA out of memory. Tried to allocate ...`` with its figures."""
    CUDA_ERROR_OOM = "cuda_error_oom"
    """``CUDA error: out of memory`` (or cuBLAS ``ALLOC_FAILED``) outside the caching allocator, no figures."""
    PINNED_HOST_OOM = "pinned_host_oom"
    """The same CUDA error from a page-locked host allocation (``cudaHostAlloc`` via ``pin_memory``)."""
    HOST_OOM = "host_oom"
    """Host RAM ran out: the kernel killed the process (SIGKILL, exit -9/137) or an allocation failed."""
    NCCL_ERROR = "nccl_error"
    OP_BUILD_ERROR = "op_build_error"
    """A DeepSpeed op (cpu_adam, fused_adam, ...) failed to JIT-compile or load."""


TITLES = {
    EventKind.GPU_OOM: "GPU out of memory (PyTorch caching allocator)",
    EventKind.CUDA_ERROR_OOM: "CUDA error: out of memory (outside PyTorch's caching allocator)",
    EventKind.PINNED_HOST_OOM: "pinned (page-locked) host memory allocation failed",
    EventKind.HOST_OOM: "host RAM ran out",
    EventKind.NCCL_ERROR: "NCCL error",
    EventKind.OP_BUILD_ERROR: "DeepSpeed op build failed",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Frame:
    path: str
    line: int
    function: str
    code: str = ""
    """The source line(s) the traceback shows under the frame."""

    @property
    def short_path(self) -> str:
        """``.../site-packages/deepspeed/runtime/engine.py`` -> ``deepspeed/runtime/engine.py``."""
        p = self.path.replace("\\", "/")
        for mark in ("site-packages/", "dist-packages/"):
            if mark in p:
                return p.rsplit(mark, 1)[1]
        return p.rsplit("/", 1)[-1]


@dataclass(frozen=True, slots=True, kw_only=True)
class OomNumbers:
    """The figures of an out-of-memory message, in bytes; ``None`` where the message has none.

    torch 1.x: ``Tried to allocate A (GPU g; T total capacity; L already allocated; F free;
    R reserved in total by PyTorch)`` (``cached`` before 1.5). torch 2.x: ``Tried to allocate A. GPU g
    has a total capacity of T of which F is free. Including non-PyTorch memory, this process has P
    memory in use. Of the allocated memory L is allocated by PyTorch, [with X allocated in private
    pools,] and U is reserved by PyTorch but unallocated.`` (so R = L + U).
    """

    tried_to_allocate_bytes: int | None = None
    total_capacity_bytes: int | None = None
    free_bytes: int | None = None
    allocated_bytes: int | None = None
    """In live tensors: "already allocated" (1.x) / "allocated by PyTorch" (2.x)."""
    reserved_bytes: int | None = None
    """Held by this process's caching allocator: printed (1.x) or allocated + unallocated (2.x)."""
    reserved_unallocated_bytes: int | None = None
    """Reserved but not in any tensor (2.x prints it; 1.x: reserved - allocated)."""
    private_pools_bytes: int | None = None
    process_in_use_bytes: int | None = None
    """2.x: this process's use of the GPU, including non-PyTorch memory (CUDA context, NCCL)."""
    other_processes_bytes: tuple[int, ...] = ()
    """2.x when NVML lists them: ``Process N has X memory in use`` for each process."""
    allowed_bytes: int | None = None
    """Cap set by ``torch.cuda.set_per_process_memory_fraction``."""
    precision_bytes: int = 0
    """Half a unit of the last printed digit of the coarsest figure (0.005 GiB = 5,368,709 B)."""
    form: str = ""
    """``torch 1.x``, ``torch 2.x`` or ``host`` (``DefaultCPUAllocator``/numpy)."""

    @property
    def outside_allocator_bytes(self) -> int | None:
        """Used on the GPU but not by this process's caching allocator: total - free - reserved (the
        CUDA context, NCCL and cuBLAS workspaces, and every other process on the same GPU)."""
        if None in (self.total_capacity_bytes, self.free_bytes, self.reserved_bytes):
            return None
        out = self.total_capacity_bytes - self.free_bytes - self.reserved_bytes  # type: ignore[operator]
        if out < -3 * self.precision_bytes:
            return None  # the printed figures contradict each other: no figure rather than a negative one
        return max(out, 0)  # within the printed rounding


@dataclass(frozen=True, slots=True, kw_only=True)
class LogEvent:
    kind: EventKind
    message: str
    """The line that says it, as printed (colours and rank prefix removed)."""
    line: int
    """1-based line number in the log."""
    rank: int | None = None
    host: str | None = None
    gpu_index: int | None = None
    numbers: OomNumbers | None = None
    exit_code: int | None = None
    detail: str = ""
    """Kind-specific: the op that failed to build and the first compiler error; the NCCL error code
    and its ``Last error``; the signal."""
    out_of_memory: bool = False
    """For NCCL errors: the CUDA failure behind it was out of memory."""
    frames: tuple[Frame, ...] = ()
    """Outermost first, as the traceback prints them."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReconRow:
    """One figure set side by side: what the log says and what the plan says."""

    label: str
    log_bytes: int | None
    plan_bytes: int | None
    note: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Reconciliation:
    """The log's figures against the plan's, for the phase and device that failed."""

    scenario_name: str
    phase: str
    phase_basis: str
    """Why this phase: where the log places the failure, or (without one) the plan's peak."""
    device: str
    """``gpu`` (per rank) or ``cpu`` (host RAM per node)."""
    rows: tuple[ReconRow, ...]
    items: tuple[LedgerItem, ...]
    """The plan's items live at the phase's peak on that device, largest first."""
    plan_verdict: str
    """``predicted`` (the plan fails here too), ``predicted_elsewhere`` (it fails, but first in
    another phase or device) or ``not_predicted`` (the plan says this phase fits)."""
    plan_failure: Failure | None
    """The plan's first failure, if any."""
    lines: tuple[str, ...]
    """Where the log and the plan agree or disagree, in words."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Diagnosis:
    events: tuple[LogEvent, ...]
    """Every recognised failure, in log order."""
    primary: LogEvent | None
    """The root cause: an op build failure first (nothing runs without it), else the earliest
    memory failure, else the earliest NCCL error (often another rank's failure seen from here)."""
    headline: str
    phase: str | None
    phase_reason: str
    phase_source: str
    """``traceback``, ``progress`` (a log line, no traceback) or ``none``."""
    phase_frame: Frame | None
    explanation: tuple[str, ...]
    fixes: tuple[str, ...]
    reconciliation: Reconciliation | None
    findings: tuple[Finding, ...]
    deepspeed_version: str | None = None
    torch_version: str | None = None
    next_step: tuple[str, ...] = ()
    """How to get a configuration that fits: recommend's smallest fitting change for the scenario
    (``next_step.smallest_fit``), or how to plan the run when no scenario was given."""


MEMORY_KINDS = (EventKind.GPU_OOM, EventKind.CUDA_ERROR_OOM, EventKind.PINNED_HOST_OOM, EventKind.HOST_OOM)
"""Events that are memory running out (NCCL errors count when CUDA ran out inside them)."""
