"""The allocator simulators against what torch's own test suite asserts on real GPUs, and against
published programs whose GPU memory was read off a real card.

There is no GPU recording in this repository yet (tests/fixtures/cuda is empty until the GPU kit
runs), so the measured references for the allocator rules are:

- pytorch/pytorch ``test/test_cuda.py`` @000e43cd: tests that PyTorch's CI runs on CUDA machines
  (and again with ``expandable_segments:True`` through ``test/test_cuda_expandable_segments.py``).
  Each test below replays the same allocation sequence through the simulator and expects what that
  test asserts on the GPU (its numbers are restated here, derived in the comments; no code of it is
  copied). Tests named: ``TestCudaMallocAsync.test_allocator_settings``,
  ``TestCudaMallocAsync.test_max_split_expandable``, ``TestCuda.test_memory_stats``,
  ``TestCuda.test_record_stream``, ``TestCuda.test_caching_pinned_memory``,
  ``TestCuda.test_host_memory_stats``, ``TestCuda.test_cublas_workspace_explicit_allocation``.
- Published one-line programs with the device memory they left in use: pytorch#54564 (nvidia-smi,
  RTX 3090, CUDA 11.1) and pytorch#86509 (``cudaMemGetInfo``, ``CUDA_MODULE_LOADING=DEFAULT``). The
  program's tensors go through the caching allocator simulator; what it reserves plus memfit's
  non-PyTorch model must equal the reading. And pytorch#76811 (``memory_allocated`` after moving an
  ``nn.Linear(100, 100)``: odd sizes, so the 512-byte rounding of each request shows).
"""

from __future__ import annotations

import pytest

from memfit.core.alloc.conf import parse_alloc_conf
from memfit.core.alloc.cuda_caching import CudaCachingAllocator, OutOfMemory
from memfit.core.alloc.non_pytorch import non_pytorch_gpu
from memfit.core.alloc.pinned_host import PinnedHostAllocator
from memfit.core.alloc.versions import resolve_torch_version

MiB = 2**20
V213 = resolve_torch_version("2.13")
EXPANDABLE = ("", "expandable_segments:True")
"""test_cuda.py runs as is and again under expandable_segments:True (test_cuda_expandable_segments.py)."""


def conf(*parts: str):
    return parse_alloc_conf(",".join(p for p in parts if p), V213)


def active_after(sim: CudaCachingAllocator, nbytes: int) -> int:
    """``active_bytes.all.allocated`` grows by the block a request gets."""
    before = sim.stats.active_bytes.current
    sim.malloc(nbytes)
    return sim.stats.active_bytes.current - before


# ------------------------------------------------------------------ round_size, as test_allocator_settings sees it

NBYTES = 21 * 1024 * 1024 * 4
"""test_allocator_settings: ``torch.rand(21 * 1024 * 1024, device="cuda")``, fp32: 84 MiB."""
NBYTES_BIG = 100 * 1024 * 1024 * 4
"""... and ``torch.rand(100 * 1024 * 1024)``: 400 MiB."""
LIST = "roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]"


@pytest.mark.parametrize("extra", EXPANDABLE)
@pytest.mark.parametrize("settings, nbytes, block", [
    ("", NBYTES, NBYTES),                                  # no rounding beyond 512 B: the request itself
    ("roundup_power2_divisions:4", NBYTES, 96 * MiB),      # 84 MiB in [64, 128) MiB, 4 steps of 16 MiB -> 96
    ("garbage_collection_threshold:0.5,max_split_size_mb:40", NBYTES, NBYTES),  # divisions reset
    ("garbage_collection_threshold:0.5," + LIST, NBYTES, 88 * MiB),  # [64,128) MiB: 8 steps of 8 MiB -> 88
    ("garbage_collection_threshold:0.5," + LIST, NBYTES_BIG, 512 * MiB),  # [256,512): 2 steps of 128 -> 512
])
def test_allocator_settings_block_sizes(settings, nbytes, block, extra):
    """TestCudaMallocAsync.test_allocator_settings: the growth of ``active_bytes.all.allocated`` for
    one tensor, and ``requested_bytes`` growing by the request itself."""
    sim = CudaCachingAllocator(conf(settings, extra), device_total_bytes=80 * 2**30)
    requested = sim.stats.requested_bytes.current
    assert active_after(sim, nbytes) == block
    assert sim.stats.requested_bytes.current - requested == nbytes


@pytest.mark.parametrize("extra", EXPANDABLE)
def test_memory_stats_one_kib(extra):
    """TestCuda.test_memory_stats: ``torch.randn(256)`` makes active bytes grow by exactly 1024;
    deleted and ``empty_cache()``d, they drop back by 1024."""
    sim = CudaCachingAllocator(conf(extra), device_total_bytes=80 * 2**30)
    b = sim.malloc(256 * 4)
    assert sim.stats.active_bytes.current == 1024
    sim.free(b)
    sim.empty_cache()
    assert sim.stats.active_bytes.current == 0


def test_pytorch_76811_linear_100_allocated():
    """pytorch#76811 (torch 1.11.0, A100-SXM4-40GB): ``torch.nn.Linear(100, 100).to(device)`` then
    ``torch.cuda.memory_allocated(device)`` prints 40960. The weight is 40,000 B and the bias 400 B,
    neither a multiple of 512: ``round_size`` gives each its own block, 40,448 and 512 B (kMinBlockSize
    rounding), 40,960 together. The one published reading here whose sizes exercise the 512-byte rule:
    the recorded sequences of torch's test_cuda.py use multiples of it. With 256-byte rounding it would be
    40,192 + 512 = 40,704."""
    sim = CudaCachingAllocator(device_total_bytes=40 * 2**30)
    sim.malloc(100 * 100 * 4)
    sim.malloc(100 * 4)
    assert sim.stats.allocated_bytes.current == 40_960


# ------------------------------------------------------------------ max_split_size, expandable segments and the OOM path

def test_max_split_expandable():
    """TestCudaMallocAsync.test_max_split_expandable: with the process limited to 120 MiB
    (``set_per_process_memory_fraction``), 40 MiB tensors made under ``max_split_size_mb:40`` with
    expandable segments off, on, off all fit; a fourth raises OutOfMemoryError; once the three are
    deleted, a 120 MiB tensor fits again (the cached oversize blocks and the expandable segment's
    pages are released by the retry path)."""
    total = 240 * MiB
    off = conf("expandable_segments:False,max_split_size_mb:40,per_process_memory_fraction:0.5")
    on = conf("expandable_segments:True,max_split_size_mb:40,per_process_memory_fraction:0.5")
    sim = CudaCachingAllocator(off, device_total_bytes=total)
    a = sim.malloc(40 * MiB)
    sim.conf = on
    b = sim.malloc(40 * MiB)
    sim.conf = off
    c = sim.malloc(40 * MiB)
    with pytest.raises(OutOfMemory):
        sim.malloc(40 * MiB)
    for x in (a, b, c):
        sim.free(x)
    try:
        big = sim.malloc(120 * MiB)
    except OutOfMemory as e:
        pytest.fail(f"on a GPU the 120 MiB tensor fits once the three are deleted; the simulator: {e}")
    assert big.size == 120 * MiB and sim.stats.allocated_bytes.current == 120 * MiB


# ------------------------------------------------------------------ streams: a block recorded on another stream

@pytest.mark.parametrize("extra", EXPANDABLE)
def test_record_stream(extra):
    """TestCuda.test_record_stream: a 16-byte tensor made on a side stream and recorded on the main
    stream is not reused by a same-size request on the side stream while the main stream still
    uses it ("allocation reused to soon"), and is reused once that use has completed ("allocation
    not reused")."""
    side = 1
    sim = CudaCachingAllocator(conf(extra), device_total_bytes=80 * 2**30)
    tmp = sim.malloc(16, stream=side)
    ptr = tmp.ptr
    sim.free(tmp, deferred=True)            # tmp.record_stream(main); del tmp
    tmp2 = sim.malloc(16, stream=side)
    assert tmp2.ptr != ptr
    sim.complete(tmp)                       # main stream synchronized
    tmp3 = sim.malloc(16, stream=side)
    assert tmp3.ptr == ptr


# ------------------------------------------------------------------ the pinned host allocator

def test_caching_pinned_memory():
    """TestCuda.test_caching_pinned_memory: a freed pinned block is reused by the next request
    (same pointer); while a non-blocking copy still reads it, it is not."""
    h = PinnedHostAllocator.for_version(V213)
    t = h.allocate(4)                       # torch.FloatTensor([1]).pin_memory()
    ptr = t.ptr
    h.free(t)
    t = h.allocate(4)
    assert t.ptr == ptr, "allocation not reused"
    h.free(t, deferred=True)                # gpu_tensor.copy_(t, non_blocking=True); del t
    t2 = h.allocate(4)
    assert t2.ptr != ptr, "allocation reused too soon"


def test_host_memory_stats():
    """TestCuda.test_host_memory_stats: ``torch.ones(10 * 1024, pin_memory=True)`` (40 KiB) holds a
    64 KiB block, ``torch.ones(20 * 1024, ...)`` (80 KiB) a 128 KiB one: allocated bytes, allocation
    count and cudaHostAlloc count; ``_host_emptyCache()`` with both alive changes nothing."""
    h = PinnedHostAllocator.for_version(V213)
    h.allocate(10 * 1024 * 4)
    assert (h.stats.allocated_bytes.current, h.stats.allocations.current, h.stats.num_host_alloc) == (64 * 1024, 1, 1)
    h.allocate(20 * 1024 * 4)
    expected = (64 * 1024 + 128 * 1024, 2, 2)
    assert (h.stats.allocated_bytes.current, h.stats.allocations.current, h.stats.num_host_alloc) == expected
    h.empty_cache()
    assert (h.stats.allocated_bytes.current, h.stats.allocations.current, h.stats.num_host_alloc) == expected


# ------------------------------------------------------------------ GPU memory outside the caching allocator

def test_cublas_workspace_explicit_allocation():
    """TestCuda.test_cublas_workspace_explicit_allocation: the first matmul grows active bytes by the
    default cuBLAS workspace, ``:4096:2:16:8`` = 8 MiB + 128 KiB, or 32 MiB on compute capability
    9.0, within the test's own 512 KiB (524,288 B); and it is allocator memory (torch >= 1.13)."""
    tol = 524_288  # the bound test_cuda.py itself asserts on the GPU
    for gpu, expected in (("a100-80gb", 4096 * 2 * 1024 + 16 * 8 * 1024), ("h100-80gb", 4096 * 8 * 1024)):
        np = non_pytorch_gpu(gpu, torch=V213, cuda="12.8", world_size=1)
        assert abs(np.cublas_workspace_bytes - expected) < tol, gpu
        assert np.cublas_in_allocator


@pytest.mark.parametrize("key, nvidia_smi_mib, tensor_bytes", [
    (("sm_61", 10), 721, 4),                      # pytorch#55277: torch.Tensor(1).cuda(), GTX 1080
    (("sm_70", 10), 1008.1875, 6 * 4),            # pytorch#28394: Titan V, a 2x3 tensor, 2 MiB cached
    (("sm_75", 10), 1035, 64 * 16 * 200 * 200 * 4),  # pytorch#49877: RTX 2080 Ti
    (("sm_86", 11), 1001, 100 * 100 * 4),         # pytorch#54564: RTX 3090, CUDA 11.1
    (("sm_86", 11), 1644, 64 * 16 * 200 * 200 * 4),  # pytorch#49877: RTX 3090, torch 1.7.1+cu110
    (("sm_86", 11), 1687, 4),                     # pytorch#55277: RTX 3090, torch 1.8.2+cu111
])
def test_eager_context_readings_are_the_published_figures(key, nvidia_smi_mib, tensor_bytes):
    """Each eager context memfit keeps is a published nvidia-smi reading less the segment the caching
    allocator reserved for the reader's tensor (simulated; a 2 MiB segment where the issue reports 2 MiB
    cached); the figure for a stack is the median of its generation's readings, and its stated error
    covers every reading of that generation."""
    from memfit.core.alloc.non_pytorch import CONTEXT_EAGER

    sim = CudaCachingAllocator(device_total_bytes=24 * 2**30)
    sim.malloc(tensor_bytes)
    context = round(nvidia_smi_mib * MiB) - sim.stats.reserved_bytes.current
    assert context in {r.bytes for r in CONTEXT_EAGER[key]}
    arch, gen = key
    gpu = {"sm_70": "v100-32gb", "sm_75": "t4", "sm_86": "rtx3090"}.get(arch)
    if gpu is not None:
        np = non_pytorch_gpu(gpu, torch=resolve_torch_version("1.10"), cuda="10.2" if gen == 10 else "11.3", world_size=1)
        assert abs(np.context_bytes - context) <= np.context_off_by_bytes


def test_v100_cuda11_eager_context_is_the_generations_reading():
    """No published reading isolates V100's context under a CUDA 11.x wheel (the re-check of issue 19 cites
    about 1.3 GB); memfit takes the median cu11x reading (RTX 3090: 1,486 MiB) and says it may be off by the
    readings' spread, which covers 1.3 GB."""
    np = non_pytorch_gpu("v100-32gb", torch=resolve_torch_version("1.10"), cuda="11.3", world_size=1)
    assert np.context_bytes == 1486 * MiB and "an estimate" in np.context_source
    assert abs(np.context_bytes - 1.3e9) <= np.context_off_by_bytes


def test_pytorch_86509_eager_context():
    """pytorch#86509: ``torch.randn(20, 16, 50, 100).cuda()`` with ``CUDA_MODULE_LOADING=DEFAULT``
    (eager) leaves total - free = 666,632,192 B per ``cudaMemGetInfo``. The 6,400,000-byte tensor
    (1-10 MiB) gets a 20 MiB segment; with memfit's eager context for a GPU other than sm_86 that
    is the reading, to the byte (the PR does not name its GPU; an A100 stands for it, with
    CUDA_MODULE_LOADING=DEFAULT the scenario's, as in the PR; lazy loading needs CUDA >= 11.7)."""
    sim = CudaCachingAllocator(device_total_bytes=80 * 2**30)
    sim.malloc(20 * 16 * 50 * 100 * 4)
    np = non_pytorch_gpu("a100-80gb", torch=resolve_torch_version("1.13"), cuda="11.7", world_size=1,
                         module_loading="DEFAULT")
    assert sim.stats.reserved_bytes.current + np.context_bytes + np.nccl_bytes == 666_632_192
