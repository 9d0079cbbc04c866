"""The ledger's path into the allocator simulators (``memfit.core.alloc.tracker.MemoryTracker``, the
figures every phase reports) against published readings of real programs.

``test_alloc_vs_torch_tests.py`` checks the simulators themselves on these programs; here the same
programs go through the tracker the way the ledger drives it (the memory outside PyTorch booked as
``outside``, tensors through ``alloc_gpu``/``alloc_pinned``), so the figures the verdict and the
reports read are what is compared:

- pytorch#86509: ``torch.randn(20, 16, 50, 100).cuda()`` with ``CUDA_MODULE_LOADING=DEFAULT`` leaves
  ``total - free`` = 666,632,192 B per ``cudaMemGetInfo``. That is what a failing ``cudaMalloc`` cannot
  get back while the tensor lives: memfit's OOM-relevant figure (the live tensor's segment + the
  memory outside PyTorch), and also the nvidia-smi figure (nothing is cached).
- pytorch#95823: one fp16 pinned tensor of 4,347,592,704 elements; ``free -m`` "shared" grew by
  8,302 MiB on torch 1.10.1 and 16,394 MiB on 1.13.1: the tracker's locked pinned bytes, and what
  it hands the ledger as the item's locked bytes.
"""

from __future__ import annotations

from memfit.core.alloc.conf import parse_alloc_conf
from memfit.core.alloc.non_pytorch import non_pytorch_gpu
from memfit.core.alloc.tracker import MemoryTracker
from memfit.core.alloc.versions import resolve_torch_version

MiB = 2**20


def _tracker(version: str, total: int) -> MemoryTracker:
    v = resolve_torch_version(version)
    return MemoryTracker(version=v, conf=parse_alloc_conf(None, v), gpu_total_bytes=total)


def _outside(t: MemoryTracker, gpu: str, version: str, cuda: str, module_loading: str | None = None) -> None:
    np = non_pytorch_gpu(gpu, torch=resolve_torch_version(version), cuda=cuda, world_size=1,
                         module_loading=module_loading)
    t.alloc_gpu(np.context_bytes + np.nccl_bytes, outside=True)


def test_pytorch_86509_used_memory_is_the_oom_relevant_figure():
    t = _tracker("1.13", 80 * 2**30)
    t.start_phase()
    _outside(t, "a100-80gb", "1.13", "11.7", "DEFAULT")  # as test_alloc_vs_torch_tests.py reads the PR
    t.alloc_gpu(20 * 16 * 50 * 100 * 4, outside=False)
    f = t.figures()
    assert f.gpu_oom_relevant_bytes == 666_632_192
    assert f.gpu_nvidia_smi_bytes == 666_632_192


def test_pytorch_95823_locked_pinned_bytes():
    """Tolerance 12 MiB: the measured growth exceeds the pinned block by 9.7-10 MiB in both runs (the
    script's own allocations between the two ``free`` readings; see test_alloc_pinned.py)."""
    for version, measured_mib in (("1.10", 8_302), ("1.13", 16_394)):
        t = _tracker(version, 24 * 2**30)
        t.start_phase()
        _, locked = t.alloc_pinned("param.pinned", 4_347_592_704 * 2)  # what the ledger books for the item
        assert abs(t.figures().cpu_pinned_locked_bytes / MiB - measured_mib) < 12  # observed 9.7-10 MiB (docstring)
        assert abs(locked / MiB - measured_mib) < 12  # observed 9.7-10 MiB (docstring)
