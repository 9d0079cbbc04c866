"""The timeline's event log and tensor granularity (BRIEF contract 2), and its allocator figures, on
hand-made ledgers; the non-PyTorch GPU memory model."""

import dataclasses

import pytest

from memfit.core.alloc.conf import AllocConf
from memfit.core.alloc.non_pytorch import CUBLAS_WORKSPACE, CUBLAS_WORKSPACE_SM90, non_pytorch_gpu
from memfit.core.alloc.tracker import MemoryTracker
from memfit.core.alloc.versions import resolve_torch_version
from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger_types import Device

MiB = 2**20


def timeline(version="2.13", total=100 * MiB, ranks=1):
    v = resolve_torch_version(version)
    return Timeline(ranks_per_node=ranks, tracker=MemoryTracker(version=v, conf=AllocConf(), gpu_total_bytes=total))


def declare(t, key, device, **kw):
    t.declare(key, name=key, device=device, formula="f", source="s", **kw)


def test_event_log_and_most_recent_exact_tensor_is_freed():
    t = timeline()
    t.phase("a", "")
    declare(t, "g", Device.GPU)
    t.alloc("g", 3 * MiB)
    t.alloc("g", 12 * MiB)
    t.alloc("g", 3 * MiB)
    t.free("g", 3 * MiB)                   # the second 3 MiB tensor (most recent), not the first
    first = t._tensors["g"][0][1]
    assert [n for n, _, _ in t._tensors["g"]] == [3 * MiB, 12 * MiB] and first.ptr == t.tracker.gpu.segments()[0][0]
    t.free("g")                            # all of it
    assert t._tensors["g"] == [] and t.tracker.gpu.stats.allocated_bytes.current == 0
    assert [e[0] for e in t.events] == ["alloc", "alloc", "alloc", "free", "free"]
    assert t.events[0] == ("alloc", "g", Device.GPU, 3 * MiB)
    assert t.granularity_notes == []


def test_a_partial_free_of_a_lump_is_said_and_keeps_bytes_right():
    t = timeline()
    t.phase("a", "")
    declare(t, "lump", Device.GPU)
    t.alloc("lump", 30 * MiB)
    t.free("lump", 10 * MiB)               # no 10 MiB tensor: the lump is freed, 20 MiB re-allocated
    assert len(t.granularity_notes) == 1 and "no single live tensor" in t.granularity_notes[0]
    assert [n for n, _, _ in t._tensors["lump"]] == [20 * MiB]
    assert t.tracker.gpu.stats.allocated_bytes.current == 20 * MiB


def test_phase_figures_reset_at_each_phase():
    t = timeline()
    t.phase("a", "")
    declare(t, "ctx", Device.GPU, outside_allocator=True)
    declare(t, "g", Device.GPU)
    declare(t, "p", Device.CPU_PINNED)
    t.alloc("ctx", 10 * MiB)                # outside PyTorch: never in the simulator
    t.alloc("g", 3 * MiB)                   # a 20 MiB segment
    t.alloc("p", 3000)                      # 4096 B locked
    t.free("p")                             # cached: still locked
    t.phase("b", "")
    t.free("g")
    a, b = t.phases()
    assert (a.gpu_allocated_bytes, a.gpu_reserved_bytes, a.gpu_oom_relevant_bytes) == (3 * MiB, 20 * MiB, 30 * MiB)
    assert a.gpu_nvidia_smi_bytes == 30 * MiB and a.gpu_outside_pytorch_bytes == 10 * MiB
    assert (a.cpu_pinned_requested_bytes, a.cpu_pinned_locked_bytes) == (3000, 4096)
    assert a.cpu_locked_peak_bytes == 4096
    # phase b starts from what a left: the peaks are those of b (the block was live at its start)
    assert (b.gpu_allocated_bytes, b.gpu_reserved_bytes, b.cpu_pinned_requested_bytes, b.cpu_pinned_locked_bytes) == (
        3 * MiB, 20 * MiB, 0, 4096)
    g_item = next(i for i in a.items if i.key == "g")
    assert g_item.bytes == 3 * MiB and g_item.block_bytes == 3 * MiB


def test_oom_is_counted_per_phase_and_capacity_excludes_outside_memory():
    t = timeline(total=100 * MiB)
    t.phase("a", "")
    declare(t, "ctx", Device.GPU, outside_allocator=True)
    declare(t, "g", Device.GPU)
    t.alloc("ctx", 40 * MiB)
    t.alloc("g", 50 * MiB)                  # 40 + 50 <= 100
    t.phase("b", "")
    t.alloc("g", 20 * MiB)                  # 40 + 50 + 20 > 100: OOM, counted, allocated anyway
    a, b = t.phases()
    assert (a.gpu_ooms, b.gpu_ooms, b.gpu_alloc_retries) == (0, 1, 1)
    assert b.gpu_oom_relevant_bytes == 110 * MiB


def test_node_locked_peak_counts_rank0_items_once():
    t = timeline(ranks=4)
    t.phase("save", "")
    declare(t, "sd", Device.CPU_PAGEABLE, rank0_only=True)
    declare(t, "p", Device.CPU_PINNED)
    t.alloc("p", 3 * MiB)                   # locked 4 MiB per rank
    t.alloc("sd", 100)
    (s,) = t.phases()
    assert s.node_cpu_locked_peak_bytes == 4 * (4 * MiB) + 100
    assert s.node_cpu_peak_bytes == 4 * (3 * MiB) + 100


PCIE_NCCL_2 = round(544 * MiB / 24 * 2)
"""2 PCIe channels at NVIDIA/nccl#964's A100 reading per channel (2 ranks: 544 MiB / 24 channels)."""


@pytest.mark.parametrize("gpu, torch, cuda, world, loading, outside", [
    ("rtx3090", "2.13", "12.8", 2, None, 256 * MiB + PCIE_NCCL_2),                   # lazy, PCIe ring
    ("rtx3090", "1.10", "11.3", 2, None, 1486 * MiB + PCIE_NCCL_2 + CUBLAS_WORKSPACE),  # eager cu11x; cuBLAS outside
    ("a100-80gb", "1.13", "11.7", 1, "DEFAULT", 645_660_672),                         # forced eager, CUDA >= 11.7
    ("a100-80gb", "2.13", "12.8", 8, None, 400_000_000 + 688 * MiB),                  # nccl#964: 3+ ranks
    ("h100-80gb", "2.13", "12.8", 8, None, 400_000_000 + round(688 * MiB / 24 * 32) + 2**30),  # + NVLS
    ("rtx4090", "2.13", "12.8", 1, None, 426 * MiB),
])
def test_non_pytorch_model(gpu, torch, cuda, world, loading, outside):
    np = non_pytorch_gpu(gpu, torch=resolve_torch_version(torch), cuda=cuda, world_size=world, module_loading=loading)
    assert np.outside_bytes == outside
    lt = 2**20 if resolve_torch_version(torch).at_least("1.13") and not resolve_torch_version(torch).at_least("2.7") else 0
    assert np.cublaslt_workspace_bytes == lt
    np = dataclasses.replace(np, cublas_workspace_bytes=np.cublas_workspace_bytes - lt)
    assert np.cublas_workspace_bytes == (CUBLAS_WORKSPACE_SM90 if gpu.startswith("h1") else CUBLAS_WORKSPACE)
