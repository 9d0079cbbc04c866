"""The CUDA caching allocator simulator against expectations derived by hand from
c10/cuda/CUDACachingAllocator.cpp (@001074d2) and torch 2.13's AllocatorConfig.h. Each test says
which rule it exercises and how the numbers follow from it."""

import pytest

from memfit.core.alloc.blocks import allocation_size, round_size, roundup_power2_next_division
from memfit.core.alloc.conf import AllocConf, parse_alloc_conf
from memfit.core.alloc.cuda_caching import CudaCachingAllocator, OutOfMemory
from memfit.core.alloc.versions import resolve_torch_version

MiB = 2**20
V213 = resolve_torch_version("2.13")


def conf(text: str) -> AllocConf:
    return parse_alloc_conf(text, V213)


def segment_events(sim):
    return [(t.action, t.size) for t in sim.trace if t.action.startswith("segment") or t.action == "oom"]


# ---------------------------------------------------------------- rounding (round_size, get_allocation_size)

@pytest.mark.parametrize("size, rounded", [
    (1, 512), (511, 512), (512, 512), (513, 1024),
    (1_000_000, 1_000_448),          # ceil(1e6 / 512) = 1954 blocks of 512
    (MiB, MiB), (MiB + 1, MiB + 512),
])
def test_round_size_512(size, rounded):
    assert round_size(size, AllocConf()) == rounded


@pytest.mark.parametrize("rounded, segment", [
    (512, 2 * MiB), (MiB, 2 * MiB),                      # small pool: a 2 MiB segment
    (MiB + 512, 20 * MiB), (10 * MiB - 512, 20 * MiB),  # 1-10 MiB: kLargeBuffer
    (10 * MiB, 10 * MiB), (10 * MiB + 512, 12 * MiB),   # >= 10 MiB: rounded up to 2 MiB
    (939_524_096, 939_524_096),                          # a kogpt weight: already a 2 MiB multiple
])
def test_allocation_size(rounded, segment):
    assert allocation_size(rounded, AllocConf()) == segment


def test_roundup_power2_divisions():
    # the worked example in the roundup_power2_next_division comment: 1200 in 4 divisions -> 1280
    assert roundup_power2_next_division(1200, 4) == 1280
    # 3,000,000 B with 4 divisions: floor 2 MiB, step 512 KiB -> 3 MiB
    assert round_size(3_000_000, conf("roundup_power2_divisions:4")) == 3 * MiB
    # a division count of 1 is ignored (divisions > 1 in round_size): plain 512-B rounding
    assert round_size(514 * MiB + 1, conf("roundup_power2_divisions:[>:1]")) == 514 * MiB + 512


def test_roundup_power2_divisions_published_measurement():
    """pytorch#161139 (a real GPU): a 514 MiB int8 tensor under roundup_power2_divisions:[>:2]
    shows 768 MiB reserved; under [>:1], the plain size."""
    for text, reserved in (("roundup_power2_divisions:[>:2]", 768 * MiB), ("roundup_power2_divisions:[>:1]", 514 * MiB)):
        sim = CudaCachingAllocator(conf(text))
        sim.malloc(514 * MiB)
        assert sim.stats.reserved_bytes.current == reserved


# ---------------------------------------------------------------- split / no split / merge

def test_split_in_a_20mib_segment():
    sim = CudaCachingAllocator(record=True)
    a = sim.malloc(3 * MiB)            # 1-10 MiB -> a 20 MiB segment, remainder 17 MiB > 1 MiB: split
    b = sim.malloc(5 * MiB)            # best fit: the 17 MiB remainder; split again
    assert segment_events(sim) == [("segment_alloc", 20 * MiB)]
    assert sim.stats.reserved_bytes.current == 20 * MiB
    assert sim.stats.allocated_bytes.current == 8 * MiB
    assert b.ptr == a.ptr + 3 * MiB    # the request takes the front of the free block


def test_no_split_when_remainder_is_at_most_1mib():
    sim = CudaCachingAllocator()
    a = sim.malloc(12 * MiB)           # >= 10 MiB: a 12 MiB segment
    sim.free(a)
    b = sim.malloc(11 * MiB + MiB // 2)  # best fit 12 MiB; remainder 0.5 MiB <= kSmallSize: no split
    assert b.size == 12 * MiB and b.ptr == a.ptr
    assert sim.stats.allocated_bytes.current == 12 * MiB
    assert sim.stats.requested_bytes.current == 11 * MiB + MiB // 2


def test_small_pool_packs_2mib_segments():
    sim = CudaCachingAllocator()
    xs = [sim.malloc(1000) for _ in range(2048)]   # 1024 B blocks: 2048 of them fill exactly one segment
    assert sim.stats.reserved_bytes.current == 2 * MiB and sim.stats.segment.current == 1
    sim.malloc(1)
    assert sim.stats.reserved_bytes.current == 4 * MiB and len(xs) == 2048


def test_merge_on_free_makes_the_segment_releasable():
    sim = CudaCachingAllocator(record=True)
    a, b = sim.malloc(3 * MiB), sim.malloc(4 * MiB)
    assert sim.stats.nonreleasable_bytes.current == 20 * MiB
    sim.free(a)
    assert sim.segments()[0][4] == ((3 * MiB, False), (4 * MiB, True), (13 * MiB, False))
    sim.free(b)                         # merges with both neighbours: one free 20 MiB block, unsplit
    assert sim.segments()[0][4] == ((20 * MiB, False),)
    assert sim.stats.nonreleasable_bytes.current == 0
    sim.empty_cache()
    assert sim.stats.reserved_bytes.current == 0 and segment_events(sim)[-1] == ("segment_free", 20 * MiB)


def test_blocks_are_reused_only_on_their_stream():
    sim = CudaCachingAllocator()
    sim.free(sim.malloc(12 * MiB, stream=0))
    sim.malloc(12 * MiB, stream=1)
    assert sim.stats.reserved_bytes.current == 24 * MiB


def test_deferred_free_waits_for_its_event():
    sim = CudaCachingAllocator()
    a = sim.malloc(12 * MiB)
    sim.free(a, deferred=True)          # recordStream: free_requested, block still active
    assert sim.stats.allocated_bytes.current == 0 and sim.stats.active_bytes.current == 12 * MiB
    sim.malloc(12 * MiB)                # cannot reuse it yet
    assert sim.stats.reserved_bytes.current == 24 * MiB
    sim.complete(a)
    assert sim.stats.active_bytes.current == 12 * MiB


# ---------------------------------------------------------------- the OOM path

def test_oom_after_freeing_cached_blocks_and_retry_counting():
    sim = CudaCachingAllocator(capacity_bytes=100 * MiB, record=True)
    sim.free(sim.malloc(60 * MiB))                 # a 60 MiB segment, cached
    sim.malloc(70 * MiB)                           # 60 + 70 > 100: release_cached_blocks, retry succeeds
    assert sim.stats.num_alloc_retries == 1 and sim.stats.num_ooms == 0
    assert segment_events(sim) == [("segment_alloc", 60 * MiB), ("segment_free", 60 * MiB), ("segment_alloc", 70 * MiB)]
    with pytest.raises(OutOfMemory):
        sim.malloc(40 * MiB)                       # 70 live + 40 > 100, nothing to release
    assert sim.stats.num_alloc_retries == 2 and sim.stats.num_ooms == 1
    oom = sim.trace[-1]
    assert (oom.action, oom.addr, oom.size) == ("oom", 30 * MiB, 40 * MiB)


def test_stranded_memory_decides_the_oom():
    """53 MiB allocated on a 100 MiB card, yet a 40 MiB request fails: the 3 MiB block strands its
    whole 20 MiB segment, so what cannot be released is 20 + 50 = 70 MiB (the OOM-relevant figure)."""
    sim = CudaCachingAllocator(capacity_bytes=100 * MiB)
    sim.malloc(3 * MiB)
    sim.malloc(50 * MiB)
    assert sim.stats.allocated_bytes.current == 53 * MiB
    assert sim.stats.nonreleasable_bytes.current == 70 * MiB
    with pytest.raises(OutOfMemory):
        sim.malloc(40 * MiB)


def test_force_on_oom_counts_and_continues():
    sim = CudaCachingAllocator(capacity_bytes=100 * MiB, force_on_oom=True)
    sim.malloc(70 * MiB)
    sim.malloc(40 * MiB)
    assert sim.stats.num_ooms == 1 and sim.stats.nonreleasable_bytes.peak == 110 * MiB


# ---------------------------------------------------------------- max_split_size / rounding margin

def test_max_split_size_oversize_blocks():
    sim = CudaCachingAllocator(conf("max_split_size_mb:100"))
    a = sim.malloc(150 * MiB)
    sim.free(a)
    b = sim.malloc(140 * MiB)                 # oversize request, 150 < 140 + 20: takes it whole, unsplit
    assert b.ptr == a.ptr and b.size == 150 * MiB
    sim.free(b)
    c = sim.malloc(120 * MiB)                 # 150 >= 120 + 20 (kLargeBuffer margin): a new segment
    assert c.ptr != a.ptr and sim.stats.reserved_bytes.current == 270 * MiB
    d = sim.malloc(50 * MiB)                  # a small request never takes an oversize block
    assert d.ptr not in (a.ptr,) and sim.stats.reserved_bytes.current == 320 * MiB


def test_max_non_split_rounding_widens_the_margin():
    sim = CudaCachingAllocator(conf("max_split_size_mb:100,max_non_split_rounding_mb:64"))
    a = sim.malloc(150 * MiB)
    sim.free(a)
    assert sim.malloc(120 * MiB).ptr == a.ptr  # 150 < 120 + 64


def test_release_available_cached_blocks_frees_one_oversize_block_first():
    sim = CudaCachingAllocator(conf("max_split_size_mb:100"), capacity_bytes=200 * MiB, record=True)
    sim.free(sim.malloc(150 * MiB))
    sim.malloc(120 * MiB)                     # 150 + 120 > 200: the 150 MiB oversize block goes, no retry
    assert sim.stats.num_alloc_retries == 0
    assert segment_events(sim)[-2:] == [("segment_free", 150 * MiB), ("segment_alloc", 120 * MiB)]


# ---------------------------------------------------------------- garbage collection

def test_garbage_collection_threshold_frees_old_blocks_first():
    """fraction 0.5 of 200 MiB -> 100 MiB allowed; threshold 0.5 -> gc above 50 MiB. Ages are counted
    in get_free_block calls: a (cached after call 1) is 2 old, b (after call 2) 1 old at call 3; the
    average is 1.5, so only a goes, which already reclaims the 12 MiB excess."""
    sim = CudaCachingAllocator(conf("per_process_memory_fraction:0.5,garbage_collection_threshold:0.5"),
                               device_total_bytes=200 * MiB, record=True)
    sim.free(sim.malloc(30 * MiB))
    sim.free(sim.malloc(32 * MiB))
    sim.malloc(40 * MiB)
    assert segment_events(sim) == [("segment_alloc", 30 * MiB), ("segment_alloc", 32 * MiB),
                                   ("segment_free", 30 * MiB), ("segment_alloc", 40 * MiB)]
    assert sim.stats.reserved_bytes.current == 72 * MiB and sim.stats.num_alloc_retries == 0


def test_memory_fraction_limits_cudamalloc():
    sim = CudaCachingAllocator(conf("per_process_memory_fraction:0.5"), device_total_bytes=200 * MiB)
    sim.malloc(60 * MiB)
    with pytest.raises(OutOfMemory):
        sim.malloc(60 * MiB)                  # 120 > 100 allowed, whatever the card has


# ---------------------------------------------------------------- expandable segments

def test_expandable_segments_map_and_unmap_pages():
    sim = CudaCachingAllocator(conf("expandable_segments:True"), device_total_bytes=24 * 2**30, record=True)
    a = sim.malloc(25 * MiB)          # large pool: 20 MiB pages -> 2 pages mapped
    b = sim.malloc(5 * MiB)           # fits in the 15 MiB left (expandable splits any remainder >= 512 B)
    assert segment_events(sim) == [("segment_map", 40 * MiB)]
    assert b.ptr == a.ptr + 25 * MiB
    sim.free(a)
    assert sim.stats.nonreleasable_bytes.current == 20 * MiB   # page 0 holds nothing live
    sim.empty_cache()                  # unmaps page 0 only; page 1 holds b
    assert segment_events(sim)[-1] == ("segment_unmap", 20 * MiB)
    assert sim.stats.reserved_bytes.current == 20 * MiB
    assert sim.segments() == [(a.ptr + 20 * MiB, 20 * MiB, 0, True, ((5 * MiB, False), (5 * MiB, True), (10 * MiB, False)))]


def test_expandable_segments_unmap_free_pages_on_oom():
    """The large segment's free 40 MiB is unmapped by release_cached_blocks, and the small pool's new
    2 MiB page then fits: one retry, no OOM."""
    sim = CudaCachingAllocator(conf("expandable_segments:True"), capacity_bytes=60 * MiB,
                               device_total_bytes=24 * 2**30, record=True)
    a = sim.malloc(40 * MiB)
    sim.malloc(15 * MiB)
    sim.free(a)
    sim.malloc(1000)
    assert sim.stats.num_alloc_retries == 1 and sim.stats.num_ooms == 0
    assert segment_events(sim) == [("segment_map", 40 * MiB), ("segment_map", 20 * MiB),
                                   ("segment_unmap", 40 * MiB), ("segment_map", 2 * MiB)]
    assert sim.stats.reserved_bytes.current == 22 * MiB
