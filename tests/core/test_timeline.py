"""The allocation bookkeeping that every ledger line goes through."""

import pytest

from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger_types import Device


def _declare(t, key, device):
    t.declare(key, name=key, device=device, formula="f", source="s")


def test_peaks_and_items_at_peak():
    t = Timeline(ranks_per_node=2)
    t.phase("a", "first")
    _declare(t, "x", Device.GPU)
    _declare(t, "y", Device.CPU_PINNED)
    _declare(t, "z", Device.CPU_PAGEABLE)
    t.alloc("x", 100)
    t.alloc("z", 50)   # host 50
    t.alloc("y", 30)   # host 80 (peak)
    t.free("z", 50)    # host 30
    t.alloc("x", 20)   # gpu 120 (peak)
    t.phase("b", "second")
    t.free("x", 120)
    (a, b) = t.phases()
    assert a.gpu_peak_bytes == 120 and a.cpu_pinned_bytes == 30 and a.cpu_pageable_bytes == 50
    assert a.node_cpu_peak_bytes == 160
    assert {i.key: i.bytes for i in a.items} == {"x": 120, "y": 30, "z": 50}
    # phase b starts with what a left and frees the GPU item
    assert b.gpu_peak_bytes == 120 and b.cpu_pinned_bytes == 30
    assert {i.key for i in b.resident} == {"y"}


def test_freeing_more_than_live_is_a_bug():
    t = Timeline(ranks_per_node=1)
    t.phase("a", "")
    _declare(t, "x", Device.GPU)
    t.alloc("x", 10)
    with pytest.raises(AssertionError):
        t.free("x", 11)


def test_cpu_accelerator_places_gpu_and_pinned_in_pageable_memory():
    t = Timeline(ranks_per_node=1, accelerator="cpu")
    t.phase("a", "")
    _declare(t, "g", Device.GPU)
    _declare(t, "p", Device.CPU_PINNED)
    t.alloc("g", 7)
    t.alloc("p", 5)
    (a,) = t.phases()
    assert a.gpu_peak_bytes == 0 and a.cpu_pinned_bytes == 0 and a.cpu_pageable_bytes == 12
    assert not t.pinning_copies


def test_rank0_only_items_count_once_per_node():
    t = Timeline(ranks_per_node=4)
    t.phase("save", "")
    t.declare("sd", name="sd", device=Device.CPU_PAGEABLE, formula="", source="", rank0_only=True)
    _declare(t, "w", Device.CPU_PAGEABLE)
    t.alloc("w", 10)
    t.alloc("sd", 100)
    (s,) = t.phases()
    assert s.node_cpu_peak_bytes == 4 * 10 + 100
