"""PyTorch's pinned (page-locked) host allocator, simulated, per torch version.

- torch >= 1.11: ``CachingHostAllocatorImpl`` in ``ATen/core/CachingHostAllocator.h`` as installed with
  torch 2.13 (line numbers are that file's), with the CUDA backend of
  ``aten/src/ATen/cuda/CachingHostAllocator.cpp`` @03258ab2. Every request is rounded up to a power of
  two (``allocate``, h:300-309) unless it exceeds ``pinned_max_round_threshold`` or
  ``pinned_max_cached_size``; a hit pops the back of the free list of bucket ``Log2_64_Ceil(size)``
  (``get_free_block``, h:621-633): no best fit across buckets, no split. A freed block goes back to
  its bucket (``maybe_cache_block``, h:734-753) and stays page-locked until ``empty_cache`` (h:451-469),
  unless it is larger than ``pinned_max_cached_size`` (then cudaFreeHost at once). With rounding off
  for a size, the bucket holds blocks of different sizes and a popped block can be *smaller* than the
  request: the code does that, and so does this simulator (``hazards`` counts it).
  The reuse rules were read in 2.13; for 1.11 up to the header's refactor (about 2.4) the rounding is
  confirmed by measurement (pytorch#95823, 1.13.1) but the free-list structure is not (the earlier
  .cpp was not available here), so those versions use the same rules (said in ``RULES``).
- torch <= 1.10: ``aten/src/THC/THCCachingHostAllocator.cpp`` @03c8b739: ``cudaHostAlloc`` of the exact
  size; freed blocks go to ``available``, a ``std::set`` ordered by (size, ptr), and a request takes
  the smallest cached block >= size whole (``malloc``: ``available.lower_bound``); only
  ``emptyCache`` returns memory.
- DeepSpeed 0.19.8 with ``DS_PIN_MEMORY_BACKEND=native`` (``deepspeed/utils/pin_memory.py``:
  ``NativePinnedMemory``, ``ops/csrc/pin_memory/page_alloc.cpp:ds_page_aligned_alloc``):
  ``posix_memalign`` + ``mlock`` of the exact size (whole 4 KiB pages locked), freed when the tensor
  is garbage-collected; torch's cache is bypassed.

"Held" is ``host_memory_stats()["allocated_bytes"]`` (blocks in use plus cached, at block size;
``getStats``, h:484-526). "Locked" is what is page-locked in RAM: held blocks from cudaHostAlloc, plus
the ``pinned_reserve_segment_size_mb`` segment, which is locked whole from the first allocation and
never freed (``PinnedReserveSegment``, h:58-97; ``get_reserve_segment`` in the .cpp).
"""

from __future__ import annotations

from bisect import bisect_left, insort

from memfit.core.alloc.blocks import Stat
from memfit.core.alloc.conf import AllocConf
from memfit.core.alloc.versions import TorchVersion

PAGE = 4096
RULES = {
    "caching_host_allocator": "ATen/core/CachingHostAllocator.h (torch 2.13): PowerOf2Ceil, per-bucket LIFO, no split",
    "thc": "aten/src/THC/THCCachingHostAllocator.cpp (torch <= 1.10): exact size, best fit over (size, ptr), no split",
    "native": "deepspeed/utils/pin_memory.py NativePinnedMemory (DS_PIN_MEMORY_BACKEND=native): mlock, freed on GC",
}


def power_of_two_ceil(n: int) -> int:
    """``c10::llvm::PowerOf2Ceil``."""
    return 1 << (n - 1).bit_length() if n > 1 else n


def log2_ceil(n: int) -> int:
    """``c10::llvm::Log2_64_Ceil`` (the free-list index, ``size_index``)."""
    return (n - 1).bit_length()


class HostBlock:
    __slots__ = ("size", "ptr", "requested", "allocated", "event_count", "from_reserve")

    def __init__(self, size: int, ptr: int, requested: int, from_reserve: bool = False) -> None:
        self.size, self.ptr, self.requested, self.from_reserve = size, ptr, requested, from_reserve
        self.allocated = True
        self.event_count = 0


class HostStats:
    """``HostStats`` names (``torch.cuda.host_memory_stats()``), plus memfit's ``requested_bytes`` (what
    the live tensors asked for), ``locked_bytes`` (page-locked in RAM: held cudaHostAlloc blocks + the
    reserve segment) and ``hazards`` (requests handed a cached block smaller than asked)."""

    __slots__ = ("allocated_bytes", "allocations", "requested_bytes", "locked_bytes", "num_host_alloc",
                 "num_host_free", "hazards")

    def __init__(self) -> None:
        self.allocated_bytes, self.allocations, self.requested_bytes, self.locked_bytes = Stat(), Stat(), Stat(), Stat()
        self.num_host_alloc = self.num_host_free = self.hazards = 0

    def reset_peaks(self) -> None:
        for s in (self.allocated_bytes, self.allocations, self.requested_bytes, self.locked_bytes):
            s.peak = s.current


class PinnedHostAllocator:
    """One process's pinned allocator. ``allocate(n)`` -> handle, ``free(handle)``, ``empty_cache()``;
    ``mode`` is ``caching_host_allocator`` (torch >= 1.11), ``thc`` (<= 1.10) or ``native``."""

    def __init__(self, mode: str, conf: AllocConf | None = None) -> None:
        if mode not in RULES:
            raise ValueError(mode)
        self.mode = mode
        self.conf = conf or AllocConf()
        self.stats = HostStats()
        self.free_lists: dict[int, list[HostBlock]] = {}     # torch >= 1.11: bucket -> deque (back = end)
        self.available: list[tuple[int, int, int]] = []     # torch 1.10: sorted (size, ptr, id)
        self.by_id: dict[int, HostBlock] = {}
        self.pending: list[HostBlock] = []
        self.reserve_size = 0
        self.reserve_used = 0
        self._next_ptr = 0x1000_0000_0000
        self._reserve_initialized = False

    @classmethod
    def for_version(cls, version: TorchVersion, conf: AllocConf | None = None, *, native: bool = False) -> "PinnedHostAllocator":
        mode = "native" if native else ("caching_host_allocator" if version.pinned_power_of_two else "thc")
        return cls(mode, conf)

    # -- helpers -------------------------------------------------------------------------------
    def _ptr(self, size: int) -> int:
        p = self._next_ptr
        self._next_ptr += -(-max(size, 1) // PAGE) * PAGE
        return p

    def _new_block(self, size: int, requested: int) -> HostBlock:
        """``allocate_host_memory``: from the reserve segment (4 KiB bump, h:72-85) when configured and
        it has room, else cudaHostAlloc of ``size`` (``allocate_host_memory_slowpath``)."""
        from_reserve = False
        if self.mode == "caching_host_allocator" and self.conf.pinned_reserve_segment_size:
            if not self._reserve_initialized:  # get_reserve_segment(): locked at the first allocation
                self._reserve_initialized = True
                self.reserve_size = self.conf.pinned_reserve_segment_size
                self.stats.locked_bytes.add(self.reserve_size)
            need = -(-size // PAGE) * PAGE
            if self.reserve_used + need <= self.reserve_size:
                self.reserve_used += need
                from_reserve = True
        b = HostBlock(size, self._ptr(size), requested, from_reserve)
        if not from_reserve:
            locked = -(-size // PAGE) * PAGE if self.mode == "native" else size
            self.stats.locked_bytes.add(locked)
        self.stats.num_host_alloc += 1
        self.stats.allocations.add(1)
        self.stats.allocated_bytes.add(size)
        return b

    def _destroy(self, b: HostBlock) -> None:
        """``destroy_block`` -> ``free_block`` (cudaFreeHost; a reserve-segment block stays locked)."""
        self.stats.num_host_free += 1
        self.stats.allocations.add(-1)
        self.stats.allocated_bytes.add(-b.size)
        if not b.from_reserve:
            self.stats.locked_bytes.add(-(-(-b.size // PAGE) * PAGE if self.mode == "native" else b.size))

    # -- API -------------------------------------------------------------------------------------
    def allocate(self, size: int) -> HostBlock | None:
        if size == 0:
            return None
        self.process_events()
        self.stats.requested_bytes.add(size)
        if self.mode == "native":
            b = self._new_block(size, size)
        elif self.mode == "thc":
            b = self._thc_malloc(size)
        else:
            c = self.conf
            round_size = power_of_two_ceil(size) if size <= c.pinned_max_round_threshold and size <= c.pinned_max_cached_size else size
            fl = self.free_lists.get(log2_ceil(round_size))
            if fl:
                b = fl.pop()
                b.allocated = True
                if b.size < size:
                    self.stats.hazards += 1
            else:
                b = self._new_block(round_size, size)
        b.requested = size
        self.by_id[id(b)] = b
        return b

    def _thc_malloc(self, size: int) -> HostBlock:
        """THC ``HostAllocator::malloc``: the smallest cached block >= size (ties: lowest address)."""
        i = bisect_left(self.available, (size, -1, -1))
        if i < len(self.available):
            _, _, bid = self.available.pop(i)
            b = self.by_id.pop(bid)
            b.allocated = True
            return b
        return self._new_block(size, size)

    def free(self, b: HostBlock | None, *, deferred: bool = False) -> None:
        """``free``: with recorded stream uses (``deferred``) the block waits for its events."""
        if b is None:
            return
        b.allocated = False
        self.stats.requested_bytes.add(-b.requested)
        if deferred:
            b.event_count += 1
            self.pending.append(b)
            return
        self._cache(b)

    def complete(self, b: HostBlock) -> None:
        b.event_count -= 1
        if b.event_count == 0:
            self.pending.remove(b)
            self._cache(b)

    def process_events(self) -> None:
        """Ledger replays record no stream uses on pinned blocks; ``complete`` is the event."""

    def _cache(self, b: HostBlock) -> None:
        self.by_id.pop(id(b), None)
        if self.mode == "native":
            self._destroy(b)  # unpin/free on GC (NativePinnedMemory._release)
        elif self.mode == "thc":
            self.by_id[id(b)] = b
            insort(self.available, (b.size, b.ptr, id(b)))
        elif b.size > self.conf.pinned_max_cached_size:
            self._destroy(b)  # maybe_cache_block: too large to cache
        else:
            self.free_lists.setdefault(log2_ceil(b.size), []).append(b)

    def empty_cache(self) -> None:
        """``empty_cache`` (``torch.accelerator.empty_host_cache()``) / THC ``emptyCache``."""
        for b in list(self.pending):
            b.event_count = 1
            self.complete(b)
        if self.mode == "thc":
            for _, _, bid in self.available:
                self._destroy(self.by_id.pop(bid))
            self.available = []
        else:
            for fl in self.free_lists.values():
                for b in fl:
                    self._destroy(b)
            self.free_lists = {}

    @property
    def cached_bytes(self) -> int:
        if self.mode == "thc":
            return sum(s for s, _, _ in self.available)
        return sum(b.size for fl in self.free_lists.values() for b in fl)
