"""The CUDA caching allocator's data: blocks, pools, expandable segments, stats, size rules.

Mirrors pytorch/pytorch ``c10/cuda/CUDACachingAllocator.cpp`` @001074d2 (``Block``, ``BlockPool``,
``BlockComparatorSize``/``BlockComparatorAddress``, ``ExpandableSegment``, ``round_size``,
``roundup_power2_next_division``, ``get_allocation_size``) and the 2.13 constants of
``c10/core/AllocatorConfig.h:17-25``.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import NamedTuple

from memfit.core.alloc.conf import AllocConf

MiB = 2**20
K_MIN_BLOCK = 512          # kMinBlockSize: all sizes rounded to at least 512 B
K_SMALL_SIZE = MiB         # kSmallSize: largest "small" request
K_SMALL_BUFFER = 2 * MiB   # kSmallBuffer: small segments, and the page of small expandable segments
K_MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc: 1-10 MiB requests get a large_segment_size segment
K_ROUND_LARGE = 2 * MiB    # kRoundLarge: larger segments rounded to 2 MiB


class TraceEvent(NamedTuple):
    """One entry of ``torch.cuda.memory._snapshot()["device_traces"][device]`` (``TraceEntry``):
    ``action`` in alloc, free_requested, free_completed, segment_alloc, segment_free, segment_map,
    segment_unmap, oom (and snapshot, ignored). For ``oom``, ``addr`` is the free device memory CUDA
    reported (``TraceEntry.addr_``; ``device_free`` in the snapshot's dict) and ``size`` the rounded
    request."""

    action: str
    addr: int
    size: int
    stream: int = 0


def round_size(size: int, conf: AllocConf) -> int:
    """``round_size``: at least 512 B; a multiple of 512, or, when ``roundup_power2_divisions`` gives
    this size's interval more than 1 division and size > 512 x divisions, the next power-of-two
    division (a division count of 1 is ignored, pytorch#161139)."""
    if size < K_MIN_BLOCK:
        return K_MIN_BLOCK
    divisions = conf.divisions_for(size)
    if divisions > 1 and size > K_MIN_BLOCK * divisions:
        return roundup_power2_next_division(size, divisions)
    return K_MIN_BLOCK * ((size + K_MIN_BLOCK - 1) // K_MIN_BLOCK)


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """``roundup_power2_next_division`` (1200 B in 4 divisions of [1024, 2048) -> 1280)."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    low = size & ~(step - 1)
    return size if low == size else low + step


def allocation_size(size: int, conf: AllocConf) -> int:
    """``get_allocation_size``: requests <= 1 MiB get a 2 MiB segment, 1-10 MiB a ``large_segment_size``
    (20 MiB, kLargeBuffer) one, larger ones their size rounded up to 2 MiB."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return conf.large_segment_size
    return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


class Expandable:
    """``ExpandableSegment``: ``max_pages`` handles of ``page`` bytes (2 MiB for the small pool,
    kLargeBuffer for the large one) reserved for 1 1/8 of the card's memory; ``mapped`` pages are
    backed by physical memory."""

    __slots__ = ("base", "page", "max_pages", "mapped", "stream", "small")

    def __init__(self, base: int, page: int, max_pages: int, stream: int, small: bool) -> None:
        self.base, self.page, self.max_pages, self.stream, self.small = base, page, max_pages, stream, small
        self.mapped: set[int] = set()

    @property
    def size(self) -> int:
        return self.page * self.max_pages


class Block:
    """``Block``: a piece of a segment, in a doubly linked list with its neighbours."""

    __slots__ = ("size", "ptr", "stream", "small", "allocated", "prev", "next", "mapped", "es", "seg",
                 "requested", "event_count", "gc_base")

    def __init__(self, size: int, ptr: int, stream: int, small: bool) -> None:
        self.size, self.ptr, self.stream, self.small = size, ptr, stream, small
        self.allocated = False
        self.prev: Block | None = None
        self.next: Block | None = None
        self.mapped = True
        self.es: Expandable | None = None
        self.seg: list[int] | None = None
        """[segment bytes, live blocks in it] for cudaMalloc'ed segments (memfit's bookkeeping)."""
        self.requested = 0
        self.event_count = 0
        self.gc_base = 0

    @property
    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def key(self) -> int:
        """(stream, size, ptr) packed in one int, ordered as the tuple (``Pool``)."""
        return (self.stream << 128) | (self.size << 64) | self.ptr


def size_key(stream: int, size: int) -> int:
    """The smallest ``Block.key`` of ``stream`` and ``size`` (ptr 0): ``lower_bound``'s probe."""
    return (stream << 128) | (size << 64)


class Pool:
    """``BlockPool``: free mapped blocks ordered by (stream, size, ptr) (``BlockComparatorSize``);
    unmapped ones by (stream, ptr) (``BlockComparatorAddress``). The (stream, size, ptr) keys are
    packed into one int each (``Block.key``: sizes and addresses below 2^64), which sorts as the
    tuple does and compares faster; ``key >> 128`` is the stream."""

    __slots__ = ("small", "keys", "by_key", "unmapped", "gc_calls")

    def __init__(self, small: bool) -> None:
        self.small = small
        self.keys: list[int] = []
        self.by_key: dict[int, Block] = {}
        self.unmapped: dict[tuple[int, int], Block] = {}
        self.gc_calls = 0
        """``get_free_blocks_call_count``."""

    def insert(self, b: Block) -> None:
        """``insert_into_blocks`` (also stamps the block's gc age base)."""
        b.gc_base = self.gc_calls
        k = b.key()
        insort(self.keys, k)
        self.by_key[k] = b

    def erase(self, b: Block) -> None:
        k = b.key()
        if self.by_key.pop(k, None) is not None:
            keys = self.keys
            del keys[bisect_left(keys, k)]

    def lower_bound(self, stream: int, size: int) -> int:
        return bisect_left(self.keys, size_key(stream, size))

    def unmapped_sorted(self, stream: int) -> list[Block]:
        return [self.unmapped[k] for k in sorted(self.unmapped) if k[0] == stream]


class Stat:
    """A torch ``Stat``: current value and peak (plain class: a dataclass costs import time in the plan)."""

    __slots__ = ("current", "peak")

    def __init__(self) -> None:
        self.current = 0
        self.peak = 0

    def __repr__(self) -> str:
        return f"Stat(current={self.current}, peak={self.peak})"

    def add(self, n: int) -> None:
        self.current += n
        if self.current > self.peak:
            self.peak = self.current


class DeviceStats:
    """``DeviceStats`` (aggregate pool), named as ``torch.cuda.memory_stats()`` names them.
    ``nonreleasable_bytes`` is not a torch stat: bytes of every segment (expandable: every mapped page)
    holding a live block, i.e. what ``release_cached_blocks`` cannot give back."""

    __slots__ = ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes", "segment",
                 "nonreleasable_bytes", "num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
                 "num_sync_all_streams")

    def __init__(self) -> None:
        self.allocated_bytes, self.reserved_bytes, self.active_bytes = Stat(), Stat(), Stat()
        self.requested_bytes, self.segment, self.nonreleasable_bytes = Stat(), Stat(), Stat()
        self.num_alloc_retries = self.num_ooms = self.num_device_alloc = self.num_device_free = 0
        self.num_sync_all_streams = 0

    def reset_peaks(self) -> None:
        """``resetPeakStats``."""
        for s in (self.allocated_bytes, self.reserved_bytes, self.active_bytes, self.requested_bytes,
                  self.segment, self.nonreleasable_bytes):
            s.peak = s.current
