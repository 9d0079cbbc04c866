"""PyTorch's CUDA caching allocator, simulated (``c10/cuda/CUDACachingAllocator.cpp``). Its public names,
with the replay of a recording through it, are gathered in ``memfit.core.alloc.cuda_caching``.

Every rule cites the function it mirrors in pytorch/pytorch ``c10/cuda/CUDACachingAllocator.cpp`` at
commit 001074d2 (the stored version read for this module; functions are named, line numbers drift),
with the 2.13 differences from the installed headers: the 20 MiB margin an oversize cached block may
exceed a request by became ``max_non_split_rounding_mb`` and the 20 MiB segment
``large_segment_size_mb`` (``c10/core/AllocatorConfig.h:174-189, 340-345``). Where the newer generic
allocator (``c10/core/CachingDeviceAllocator.h``) also skips expandable blocks in
``garbage_collect_cached_blocks`` and ``release_available_cached_blocks``, this follows it.

One ``DeviceCachingAllocator`` (one GPU, no CUDA graph pools). Addresses are simulated: cudaMalloc
hands out increasing 2 MiB-aligned addresses unless ``forced_addresses`` holds the ones a recording
saw, so best-fit ties among equal free blocks, ordered by (stream, size, address), are deterministic.
Streams are integers. ``capacity_bytes`` is what cudaMalloc can still get from the card (None:
unlimited); beyond it cudaMalloc/cuMemCreate fails, which drives malloc's retry path as on a GPU.

OOM-relevant bytes (``stats.nonreleasable_bytes``, memfit's own counter): malloc raises OOM only when,
after ``release_cached_blocks`` has freed every segment with no live block, cudaMalloc of the new
segment still fails. What it cannot free is every segment holding a live block, whole: allocated
bytes + the free bytes stranded beside them (``inactive_split_bytes``) + the segment a request just
needed (it holds that request). With expandable segments, free pages are unmapped, so it is every
mapped page holding part of a live block. A request fails iff this, plus the new segment, plus the
memory outside PyTorch exceeds the card; the per-phase peak of it is what the verdict compares.
"""

from __future__ import annotations

from bisect import bisect_left

from memfit.core.alloc.blocks import (K_MIN_BLOCK, K_ROUND_LARGE, K_SMALL_SIZE, Block, DeviceStats,  # noqa: F401
                                      Pool, TraceEvent, allocation_size, round_size, size_key,
                                      roundup_power2_next_division)
from memfit.core.alloc.conf import SIZE_MAX, AllocConf
from memfit.core.alloc.expandable import ExpandableSegments

ADDRESS_BASE = 0x7F00_0000_0000

__all__ = ["CudaCachingAllocator", "OutOfMemory", "TraceEvent", "round_size", "allocation_size",
           "roundup_power2_next_division"]


class OutOfMemory(Exception):
    """malloc's ``TORCH_CHECK_WITH(OutOfMemoryError, ...)`` after the last retry failed."""


class CudaCachingAllocator(ExpandableSegments):
    """``DeviceCachingAllocator`` for one device: ``malloc(size, stream)`` returns a block handle,
    ``free(block)`` returns it; ``stats`` are torch's counters, ``trace`` the snapshot's actions."""

    def __init__(self, conf: AllocConf | None = None, *, capacity_bytes: int | None = None,
                 device_total_bytes: int | None = None, record: bool = False, force_on_oom: bool = False) -> None:
        self.conf = conf or AllocConf()
        self.capacity = capacity_bytes
        self.device_total = device_total_bytes
        self.record = record
        self.force_on_oom = force_on_oom
        """Ledger replays: after counting an OOM, take the memory anyway so later phases get figures."""
        self.small, self.large = Pool(True), Pool(False)
        self.stats = DeviceStats()
        self.trace: list[TraceEvent] = []
        self.total_allocated_memory = 0
        """``total_allocated_memory``: cudaMalloc'ed plus mapped bytes."""
        self.expandables: list = []
        self.active: dict[int, Block] = {}
        """``active_blocks``: allocated, or freed but waiting for a stream event."""
        self.pending: list[Block] = []
        self.event_lag: int | None = None
        """Ledger replays: mallocs after which a deferred free's stream event counts as completed
        (``process_events``); None: only ``complete`` completes one (recordings)."""
        self._lag: dict[int, int] = {}
        self.forced_addresses: list[int] = []
        self._next_addr = ADDRESS_BASE
        self._page_users: dict[tuple[int, int], int] = {}
        frac = self.conf.per_process_memory_fraction
        self.set_fraction = frac is not None and device_total_bytes is not None
        """``set_fraction`` / ``allowed_memory_maximum`` (``setMemoryFraction``: fraction x total)."""
        self.allowed_max = int(frac * device_total_bytes) if self.set_fraction else 0  # type: ignore[operator]
        self._divisions = any(d > 1 for d in self.conf.roundup_power2_divisions)
        """Whether ``round_size`` can round to a power-of-two division (else: up to 512 B)."""

    # -- helpers -------------------------------------------------------------------------------
    def _emit(self, action: str, addr: int, size: int, stream: int) -> None:
        if self.record:
            self.trace.append(TraceEvent(action, addr, size, stream))

    def _pool(self, size: int) -> Pool:
        """``get_pool``: rounded size <= 1 MiB -> small pool, else large."""
        return self.small if size <= K_SMALL_SIZE else self.large

    def _address(self, size: int, align: int = K_ROUND_LARGE) -> int:
        if self.forced_addresses:
            return self.forced_addresses.pop(0)
        addr = -(-self._next_addr // align) * align
        self._next_addr = addr + size
        return addr

    def _device_has(self, nbytes: int) -> bool:
        """cudaMalloc / cuMemCreate succeed while the card has the bytes."""
        return self.capacity is None or self.stats.reserved_bytes.current + nbytes <= self.capacity

    def _busy(self, b: Block, delta: int) -> None:
        if b.seg is not None:
            before = b.seg[1]
            b.seg[1] = before + delta
            if before == 0:
                self.stats.nonreleasable_bytes.add(b.seg[0])
            elif b.seg[1] == 0:
                self.stats.nonreleasable_bytes.add(-b.seg[0])
        elif b.es is not None:
            self._page_busy(b, delta)

    # -- malloc ----------------------------------------------------------------------------------
    def malloc(self, orig_size: int, stream: int = 0) -> Block:
        """``malloc``: round; search the pool; on a miss (gc, then) cudaMalloc; release oversize cached
        blocks and retry; release every unsplit cached block and retry (``num_alloc_retries``); else OOM
        (``num_ooms``, an ``oom`` trace entry)."""
        if self.pending and self.event_lag is not None:  # process_events' own early return, inlined
            self.process_events()
        if orig_size < K_MIN_BLOCK:
            size = K_MIN_BLOCK
        elif self._divisions:
            size = round_size(orig_size, self.conf)
        else:  # round_size without power-of-two divisions
            size = (orig_size + K_MIN_BLOCK - 1) // K_MIN_BLOCK * K_MIN_BLOCK
        pool = self.small if size <= K_SMALL_SIZE else self.large
        block = self._get_free_block(pool, size, stream)
        if block is None:
            alloc = allocation_size(size, self.conf)
            if self.set_fraction and self.conf.garbage_collection_threshold > 0.0:
                self._garbage_collect()
            block = (self._alloc_block(pool, size, alloc, stream, retry=False)
                     or (self._release_available_cached_blocks(pool, size, stream)
                         and self._alloc_block(pool, size, alloc, stream, retry=False))
                     or (self.release_cached_blocks() and self._alloc_block(pool, size, alloc, stream, retry=True))
                     or None)
            if block is None:
                self.stats.num_ooms += 1
                free = 0 if self.capacity is None else max(self.capacity - self.stats.reserved_bytes.current, 0)
                self._emit("oom", free, size, stream)
                if not self.force_on_oom:
                    raise OutOfMemory(f"CUDA out of memory. Tried to allocate {alloc} B")
                saved_cap, saved_frac = self.capacity, self.set_fraction
                self.capacity, self.set_fraction = None, False
                block = self._alloc_block(pool, size, alloc, stream, retry=False)
                self.capacity, self.set_fraction = saved_cap, saved_frac
        assert block is not None
        out = self._alloc_found_block(block, pool, size, orig_size, stream)
        lag = self._lag
        if lag:  # one malloc more behind each deferred free's stream event (process_events counts down)
            for k in lag:
                lag[k] -= 1
        return out

    def _get_free_block(self, pool: Pool, size: int, stream: int) -> Block | None:
        """``get_free_block``: lower_bound over (stream, size, ptr), same stream only. An expandable
        block is judged by the size it can grow to (free + the unmapped block after it). An oversize
        block (>= max_split_size) never serves a smaller request, and serves an oversize request only
        if it is less than ``max_non_split_rounding`` (kLargeBuffer before 2.6) bigger."""
        conf = self.conf
        if self.set_fraction and conf.garbage_collection_threshold > 0.0:
            pool.gc_calls += 1
        keys = pool.keys
        i = bisect_left(keys, size_key(stream, size))  # Pool.lower_bound
        if i == len(keys):
            return None
        k = keys[i]
        if k >> 128 != stream:
            return None
        b = pool.by_key[k]
        if b.es is not None:
            if conf.expandable_segments:
                def grow(x: Block) -> int:
                    return x.size + (x.next.size if x.next is not None and not x.next.mapped else 0)
                j = i + 1
                while b.es is not None and j < len(keys) and (keys[j] >> 128) == stream and grow(pool.by_key[keys[j]]) < grow(b):
                    b = pool.by_key[keys[j]]
                    j += 1
            else:
                j = i + 1
                while j < len(keys) and (keys[j] >> 128) == stream and pool.by_key[keys[j]].es is not None:
                    j += 1
                if j == len(keys) or (keys[j] >> 128) != stream:
                    return None
                b = pool.by_key[keys[j]]
        mss = conf.max_split_size
        if size < mss <= b.size:
            return None
        if size >= mss and b.size >= size + conf.max_non_split_rounding:
            return None
        if b.es is None and pool.by_key.get(k) is b:  # Pool.erase of the block at i
            del keys[i]
            del pool.by_key[k]
        else:
            pool.erase(b)
        return b

    def _alloc_block(self, pool: Pool, size: int, alloc: int, stream: int, *, retry: bool) -> Block | None:
        """``alloc_block``: the memory-fraction limit first (it tests ``alloc`` bytes, expandable or
        not), then expandable mapping of ``size`` or cudaMalloc of ``alloc`` (``segment_alloc``)."""
        if retry:
            self.stats.num_alloc_retries += 1
        if self.set_fraction and self.total_allocated_memory + alloc > self.allowed_max:
            return None
        if self.conf.expandable_segments:
            return self._try_allocate_expandable(pool, size, stream)
        if not self._device_has(alloc):
            return None
        ptr = self._address(alloc)
        b = Block(alloc, ptr, stream, pool.small)
        b.seg = [alloc, 0]
        self.total_allocated_memory += alloc
        self.stats.segment.add(1)
        self.stats.reserved_bytes.add(alloc)
        self.stats.num_device_alloc += 1
        self._emit("segment_alloc", ptr, alloc, stream)
        return b

    def _alloc_found_block(self, b: Block, pool: Pool, size: int, orig_size: int, stream: int) -> Block:
        """``alloc_found_block`` with ``should_split``: the small pool, or any pool under expandable
        segments, splits off a remainder >= 512 B; the large pool only a remainder > 1 MiB, and only for
        a request below max_split_size. The request takes the front; the rest goes back to the pool."""
        remaining = b.size - size
        if pool.small or self.conf.expandable_segments:
            split = remaining >= K_MIN_BLOCK
        else:
            split = size < self.conf.max_split_size and remaining > K_SMALL_SIZE
        if split:
            rest = b
            b = Block(size, rest.ptr, stream, pool.small)
            b.es, b.seg, b.prev, b.next = rest.es, rest.seg, rest.prev, rest
            if b.prev is not None:
                b.prev.next = b
            rest.prev = b
            rest.ptr += size
            rest.size -= size
            pool.insert(rest)
        b.allocated = True
        b.requested = orig_size
        self.active[id(b)] = b
        if self.record:
            self._emit("alloc", b.ptr, orig_size, stream)
        st = self.stats
        bs = b.size
        x = st.allocated_bytes  # Stat.add, inlined: the hot path of every ledger
        x.current += bs
        if x.current > x.peak:
            x.peak = x.current
        x = st.active_bytes
        x.current += bs
        if x.current > x.peak:
            x.peak = x.current
        x = st.requested_bytes
        x.current += orig_size
        if x.current > x.peak:
            x.peak = x.current
        seg = b.seg
        if seg is not None:  # _busy(b, +1)
            seg[1] += 1
            if seg[1] == 1:
                st.nonreleasable_bytes.add(seg[0])
        elif b.es is not None:
            self._page_busy(b, +1)
        return b

    # -- free ------------------------------------------------------------------------------------
    def free(self, b: Block, *, deferred: bool = False) -> None:
        """``free``: allocated bytes drop now (``free_requested``). A block used on another stream
        (``deferred``, i.e. ``recordStream``) waits for its event (``insert_events``); otherwise
        ``free_block`` returns it to the pool at once."""
        b.allocated = False
        st = self.stats
        st.allocated_bytes.current -= b.size  # Stat.add of a negative amount (the peak stays)
        if self.record:
            self._emit("free_requested", b.ptr, b.requested, b.stream)
        seg = b.seg  # _busy(b, -1); a pending block is freed by release_cached_blocks' synchronize first
        if seg is not None:
            seg[1] -= 1
            if seg[1] == 0:
                st.nonreleasable_bytes.current -= seg[0]
        elif b.es is not None:
            self._page_busy(b, -1)
        if deferred:
            b.event_count += 1
            self.pending.append(b)
            if self.event_lag is not None:
                self._lag[id(b)] = self.event_lag
        else:
            self._free_block(b)

    def complete(self, b: Block) -> None:
        """One of ``b``'s stream events completed (``process_events``); at zero it is freed."""
        b.event_count -= 1
        if b.event_count == 0:
            self.pending.remove(b)
            self._free_block(b)

    def process_events(self) -> None:
        """``process_events``: free the deferred blocks whose stream events have completed. A recording
        says when that was (``complete``); in a ledger replay (``event_lag`` set) a block freed after
        ``recordStream`` on another stream is taken as done once ``event_lag`` more mallocs have run:
        the GPU is that far behind the CPU (the caller's assumption, stated where it sets it)."""
        if self.event_lag is None or not self.pending:
            return
        for b in [b for b in self.pending if self._lag.get(id(b), 1) <= 0]:
            self._lag.pop(id(b), None)
            b.event_count = 1
            self.complete(b)

    def _free_block(self, b: Block) -> None:
        """``free_block``: merge with free neighbours (``try_merge_blocks``), cache (``free_completed``)."""
        if self.record:
            self._emit("free_completed", b.ptr, b.requested, b.stream)
        pool = self.small if b.small else self.large
        size0, req = b.size, b.requested
        prev, nxt = b.prev, b.next
        if prev is not None and not prev.allocated:  # _try_merge's first test, inlined
            self._try_merge(b, prev, pool)
        if nxt is not None and not nxt.allocated:
            self._try_merge(b, nxt, pool)
        self.active.pop(id(b), None)
        pool.insert(b)
        st = self.stats
        st.active_bytes.current -= size0
        st.requested_bytes.current -= req

    def _try_merge(self, dst: Block, src: Block | None, pool: Pool) -> int:
        """``try_merge_blocks``: absorb a free neighbour with the same mapping state."""
        if src is None or src.allocated or src.event_count > 0 or dst.mapped != src.mapped:
            return 0
        if dst.prev is src:
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        if src.mapped:
            pool.erase(src)
        else:
            del pool.unmapped[(src.stream, src.ptr)]
        return src.size

    # -- releasing -------------------------------------------------------------------------------
    def empty_cache(self) -> None:
        """``emptyCache`` (``torch.cuda.empty_cache()``) -> ``release_cached_blocks``."""
        self.release_cached_blocks()

    def release_cached_blocks(self) -> bool:
        """``release_cached_blocks``: complete pending events (``synchronize_and_free_events``), then in
        each pool (large, then small) cudaFree every unsplit free block and unmap every free page of
        expandable segments (``release_blocks``); a segment left with nothing mapped is dropped."""
        self.stats.num_sync_all_streams += 1
        if not self.pending and not self.expandables and \
                self.stats.reserved_bytes.current == self.stats.nonreleasable_bytes.current:
            return True  # every segment holds a live block: nothing to free (a shortcut, same result)
        for b in list(self.pending):
            b.event_count = 1
            self.complete(b)
        self._lag.clear()
        for pool in (self.large, self.small):
            to_unmap = []
            for k in list(pool.keys):
                b = pool.by_key.get(k)
                if b is None:
                    continue
                if b.es is not None:
                    to_unmap.append(b)
                elif not b.is_split:
                    self._release_block(b, pool)
            for b in to_unmap:
                self._unmap_block(b, pool)
                if b.prev is None and b.next is None and not b.mapped:
                    self._release_expandable(b, pool)
        return True

    def _release_block(self, b: Block, pool: Pool) -> None:
        """``release_block``: cudaFree a whole free segment (``segment_free``)."""
        self.stats.num_device_free += 1
        self._emit("segment_free", b.ptr, b.size, b.stream)
        self.total_allocated_memory -= b.size
        self.stats.segment.add(-1)
        self.stats.reserved_bytes.add(-b.size)
        pool.erase(b)

    def _release_available_cached_blocks(self, pool: Pool, size: int, stream: int) -> bool:
        """``release_available_cached_blocks`` (only with max_split_size set): cudaFree the smallest
        oversize free block >= max(size, max_split_size) on this stream; if none, oversize blocks from
        the largest down until that many bytes are freed."""
        mss = self.conf.max_split_size
        if mss == SIZE_MAX:
            return False
        need = max(size, mss)
        keys = pool.keys
        i = pool.lower_bound(stream, need)
        if i < len(keys) and (keys[i] >> 128) == stream and pool.by_key[keys[i]].es is None:
            self._release_block(pool.by_key[keys[i]], pool)
            return True
        if i == 0:
            return False
        released = 0
        i -= 1
        while released < need and i >= 0:
            b = pool.by_key[keys[i]]
            if b.size < mss or b.stream != stream:
                break
            i -= 1
            if b.es is None:
                released += b.size
                self._release_block(b, pool)
        return released >= need

    def _garbage_collect(self) -> None:
        """``garbage_collect_cached_blocks``: once cudaMalloc'ed bytes exceed threshold x allowed
        memory, cudaFree unsplit large-pool free blocks at least as old (``get_free_block`` calls since
        cached) as the average, repeatedly, until the excess is reclaimed or nothing more goes."""
        threshold = int(self.conf.garbage_collection_threshold * self.allowed_max)
        if self.total_allocated_memory <= threshold:
            return
        target = self.total_allocated_memory - threshold
        pool = self.large
        cands = [b for b in pool.by_key.values() if not b.is_split]  # the average counts expandable blocks too
        total_age = sum(pool.gc_calls - b.gc_base for b in cands)
        count = len(cands)
        reclaimed, freed = 0, True
        while reclaimed < target and freed and count > 0:
            avg = total_age / count
            freed = False
            for k in list(pool.keys):
                b = pool.by_key.get(k)
                if b is None or b.is_split or b.es is not None:
                    continue
                age = pool.gc_calls - b.gc_base
                if age >= avg:
                    freed = True
                    reclaimed += b.size
                    total_age -= age
                    count -= 1
                    self._release_block(b, pool)

    # -- reporting -------------------------------------------------------------------------------
    def segments(self) -> list[tuple[int, int, int, bool, tuple[tuple[int, bool], ...]]]:
        """(address, total size, stream, is_large, ((block size, allocated), ...)) per segment, as
        ``snapshot()`` reports them (expandable: one per contiguous mapped range), by address."""
        blocks = [*self.small.by_key.values(), *self.large.by_key.values(), *self.active.values()]
        out, seen = [], set()
        for b in blocks:
            h = b
            while h.prev is not None and h.prev.mapped:
                h = h.prev
            if id(h) in seen or not h.mapped:
                continue
            seen.add(id(h))
            parts, total, x = [], 0, h
            while x is not None and x.mapped:
                parts.append((x.size, x.allocated))
                total += x.size
                x = x.next
            out.append((h.ptr, total, h.stream, not h.small, tuple(parts)))
        return sorted(out)
