"""The ledger's alloc/free calls replayed through the allocator simulators, as they happen.

``Timeline`` (``core/ledger/timeline.py``) hands every GPU and pinned allocation (one ``alloc`` call =
one tensor) to a ``MemoryTracker``: GPU tensors go through ``CudaCachingAllocator`` on one stream with
the card's capacity minus the memory outside PyTorch (so malloc's flush-and-retry happens when it would,
and an OOM is counted, then allocated anyway so later phases still get figures); pinned tensors go
through ``PinnedHostAllocator`` under the scenario's torch version, ``PYTORCH_CUDA_ALLOC_CONF`` and
DeepSpeed pinning backend. Per phase (peaks reset at each phase start, as ``reset_peak_memory_stats``
does in a replay) it reports torch's allocated and reserved, memfit's OOM-relevant figure, the pinned
bytes requested and locked, and an nvidia-smi estimate.

Items known to bypass torch's pinned cache are listed in ``OUTSIDE_TORCH_PINNED``; GPU items declared
``outside_allocator`` (CUDA context, NCCL, cuBLAS before torch 1.13) never enter the simulator.
"""

from __future__ import annotations


from memfit.core.lean_dataclass import dataclass
from memfit.core.alloc.conf import AllocConf
from memfit.core.alloc.device_caching import CudaCachingAllocator
from memfit.core.alloc.pinned_host import PAGE, PinnedHostAllocator
from memfit.core.alloc.versions import TorchVersion

OUTSIDE_TORCH_PINNED = {
    "cpu_adam.pinned_tiles": ("exact", "csrc/includes/cpu_adam.h:Adam_Optimizer (cudaMallocHost, DeepSpeed 0.5.10/0.6.0)"),
    "nvme.param_swap_buffers": ("pages", "deepspeed/ops/csrc/aio: new_cpu_locked_tensor (posix_memalign + mlock)"),
    "nvme.optimizer_swap_buffers": ("pages", "deepspeed/ops/csrc/aio: new_cpu_locked_tensor (posix_memalign + mlock)"),
}
"""Ledger keys pinned outside torch's CachingHostAllocator: locked at their size (whole pages for
mlock), never cached."""

PINNED_CACHE_KEY = "alloc.pinned_cache"
STREAM_EVENT_LAG = 1
"""A block freed after ``record_stream`` (DeepSpeed ZeRO-3's gathered params and gradients with
``overlap_comm``) waits for an event on the other stream; the simulator takes it as completed once one
more malloc has run (the GPU one allocation behind the CPU: the next request, e.g. the prefetch that
follows a release, cannot reuse it). An assumption, not a measurement: how far the GPU lags depends
on kernel times, which memfit does not model; 0 would make such frees immediate."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseAllocFigures:
    """One phase, per rank; peaks are within the phase."""

    gpu_allocated_bytes: int
    gpu_reserved_bytes: int
    gpu_oom_relevant_bytes: int
    gpu_outside_pytorch_bytes: int
    gpu_nvidia_smi_bytes: int
    gpu_alloc_retries: int
    gpu_ooms: int
    cpu_pinned_requested_bytes: int
    cpu_pinned_locked_bytes: int


class MemoryTracker:
    def __init__(self, *, version: TorchVersion, conf: AllocConf, gpu_total_bytes: int, pin_native: bool = False) -> None:
        self.version = version
        self.gpu_total = gpu_total_bytes
        self.gpu = CudaCachingAllocator(conf, capacity_bytes=gpu_total_bytes, device_total_bytes=gpu_total_bytes,
                                        force_on_oom=True)
        self.gpu.event_lag = STREAM_EVENT_LAG
        self.host = PinnedHostAllocator.for_version(version, conf, native=pin_native)
        self.outside_gpu = 0
        self.outside_locked = 0
        self.pinned_requested = 0
        self._reset()

    def _reset(self) -> None:
        self.gpu.stats.reset_peaks()
        self.host.stats.reset_peaks()
        self.oom_peak = self.gpu.stats.nonreleasable_bytes.current + self.outside_gpu
        self.smi_peak = self.gpu.stats.reserved_bytes.current + self.outside_gpu
        self.outside_peak = self.outside_gpu
        self.locked_peak = self.pinned_locked
        self.requested_peak = self.pinned_requested
        self.retries0 = self.gpu.stats.num_alloc_retries
        self.ooms0 = self.gpu.stats.num_ooms

    @property
    def pinned_locked(self) -> int:
        return self.host.stats.locked_bytes.current + self.outside_locked

    # -- the ledger's calls ------------------------------------------------------------------------
    def alloc_gpu(self, nbytes: int, *, outside: bool, stream: int = 0) -> tuple[object, int]:
        """Returns (handle, bytes the allocator gave: the block size); ``stream``: the CUDA stream
        current when the tensor is made (0: the default stream; a side stream's blocks serve only it)."""
        if outside:
            self.outside_gpu += nbytes
            self.gpu.capacity = self.gpu_total - self.outside_gpu
            handle: object = ("outside", nbytes)
            block = nbytes
        else:
            b = self.gpu.malloc(nbytes, stream)
            handle, block = b, b.size
        s = self.gpu.stats
        outside_gpu = self.outside_gpu
        x = s.nonreleasable_bytes.current + outside_gpu
        if x > self.oom_peak:
            self.oom_peak = x
        x = s.reserved_bytes.current + outside_gpu
        if x > self.smi_peak:
            self.smi_peak = x
        if outside_gpu > self.outside_peak:
            self.outside_peak = outside_gpu
        return handle, block

    def free_gpu(self, handle: object, *, deferred: bool = False) -> None:
        """``deferred``: the tensor was used on another stream (``record_stream``): its block is
        reusable once that stream's event completes (``STREAM_EVENT_LAG``)."""
        if isinstance(handle, tuple):
            self.outside_gpu -= handle[1]
            self.gpu.capacity = self.gpu_total - self.outside_gpu
        else:
            self.gpu.free(handle, deferred=deferred)  # type: ignore[arg-type]

    def alloc_pinned(self, key: str, nbytes: int) -> tuple[object, int]:
        """Returns (handle, bytes locked for it: its block, or its exact/page-rounded size outside)."""
        rule = OUTSIDE_TORCH_PINNED.get(key)
        if rule is not None:
            locked = nbytes if rule[0] == "exact" else -(-nbytes // PAGE) * PAGE
            self.outside_locked += locked
            handle: object = ("outside", locked, nbytes)
        else:
            b = self.host.allocate(nbytes)
            handle, locked = b, b.size  # type: ignore[union-attr]
        self.pinned_requested += nbytes
        self.locked_peak = max(self.locked_peak, self.pinned_locked)
        self.requested_peak = max(self.requested_peak, self.pinned_requested)
        return handle, locked

    def free_pinned(self, handle: object) -> None:
        if isinstance(handle, tuple):
            self.outside_locked -= handle[1]
            self.pinned_requested -= handle[2]
        else:
            self.pinned_requested -= handle.requested  # type: ignore[attr-defined]
            self.host.free(handle)  # type: ignore[arg-type]

    # -- phases ----------------------------------------------------------------------------------
    def start_phase(self) -> None:
        self._reset()

    def figures(self) -> PhaseAllocFigures:
        s = self.gpu.stats
        return PhaseAllocFigures(
            gpu_allocated_bytes=s.allocated_bytes.peak, gpu_reserved_bytes=s.reserved_bytes.peak,
            gpu_oom_relevant_bytes=self.oom_peak, gpu_outside_pytorch_bytes=self.outside_peak,
            gpu_nvidia_smi_bytes=self.smi_peak, gpu_alloc_retries=s.num_alloc_retries - self.retries0,
            gpu_ooms=s.num_ooms - self.ooms0, cpu_pinned_requested_bytes=self.requested_peak,
            cpu_pinned_locked_bytes=self.locked_peak)
