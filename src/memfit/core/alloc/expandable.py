"""Expandable segments (``expandable_segments:True``, Note [Expandable Segments]), as a mixin of the
CUDA caching allocator simulator.

Mirrors pytorch/pytorch ``c10/cuda/CUDACachingAllocator.cpp`` @001074d2: ``find_expandable_block``,
``try_allocate_expandable_block``, ``map_block``, ``unmap_block``, ``release_expandable_segment`` and
``ExpandableSegment::map/unmap``. One segment per (stream, pool) grows by pages (2 MiB small pool,
kLargeBuffer = 20 MiB large pool); its address range is 1 1/8 of the card's memory
(``prop.totalGlobalMem + totalGlobalMem / 8``). On OOM, ``release_cached_blocks`` unmaps every fully
free page, so trapped free space shrinks to page granularity.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memfit.core.alloc.blocks import K_SMALL_BUFFER, Block, Expandable, Pool
from memfit.core.alloc.conf import LARGE_BUFFER

if TYPE_CHECKING:
    from memfit.core.alloc.blocks import DeviceStats

DEFAULT_TOTAL = 80 * 2**30
"""Address-space size when the card's memory is not given (only the reservation's size, never bytes
held, depends on it)."""


class ExpandableSegments:
    """Methods of ``CudaCachingAllocator`` for expandable segments (state lives on the allocator)."""

    stats: "DeviceStats"
    expandables: list[Expandable]
    device_total: int | None
    total_allocated_memory: int
    _page_users: dict[tuple[int, int], int]

    # provided by CudaCachingAllocator: _address, _device_has, _emit, _try_merge

    def _try_allocate_expandable(self, pool: Pool, size: int, stream: int) -> Block | None:
        """``try_allocate_expandable_block``: find room (free and unmapped blocks), map what is
        missing page by page, return the (now mapped, free) block of at least ``size``."""
        c = self._find_expandable_block(pool, size, stream)
        if not c.mapped and not self._map_block(c, min(c.size, size), pool):
            return None
        while c.size < size:
            nxt = c.next
            assert nxt is not None
            if not self._map_block(nxt, min(size - c.size, nxt.size), pool):
                return None
            c = nxt
        pool.erase(c)
        return c

    def _find_expandable_block(self, pool: Pool, size: int, stream: int) -> Block:
        """``find_expandable_block``: the lowest-address unmapped block of this stream (or the free
        block just before it) with enough free + unmapped space after it; else a new segment."""
        def allocatable(b: Block | None) -> bool:
            return b is not None and not b.allocated and b.event_count == 0

        def has_space(b: Block | None) -> bool:
            n = 0
            while n < size and allocatable(b):
                n += b.size  # type: ignore[union-attr]
                b = b.next  # type: ignore[union-attr]
            return n >= size

        for c in pool.unmapped_sorted(stream):
            if allocatable(c.prev):
                c = c.prev  # type: ignore[assignment]
            if has_space(c):
                return c
        page = K_SMALL_BUFFER if pool.small else LARGE_BUFFER
        total = self.device_total or DEFAULT_TOTAL
        reserve = total + total // 8
        max_pages = -(-reserve // page)
        base = self._address(max_pages * page, page)
        es = Expandable(base, page, max_pages, stream, pool.small)
        self.expandables.append(es)
        c = Block(es.size, base, stream, pool.small)
        c.mapped, c.es = False, es
        pool.unmapped[(stream, base)] = c
        return c

    def _map_block(self, to_map: Block, size: int, pool: Pool) -> bool:
        """``map_block`` + ``ExpandableSegment::map``: back the pages covering [ptr, ptr+size) (one
        cuMemCreate each; any failure maps nothing), split off the still-unmapped rest, merge with free
        neighbours (``segment_map``)."""
        es = to_map.es
        assert es is not None and not to_map.mapped
        begin = (to_map.ptr - es.base) // es.page
        end = -(-(to_map.ptr + size - es.base) // es.page)
        n = end - begin
        if n <= 0 or not self._device_has(n * es.page):
            return False
        es.mapped.update(range(begin, end))
        mapped = n * es.page
        ptr0 = to_map.ptr
        del pool.unmapped[(to_map.stream, to_map.ptr)]
        to_map.mapped = True
        if mapped < to_map.size:
            rest = Block(to_map.size - mapped, to_map.ptr + mapped, to_map.stream, to_map.small)
            rest.mapped, rest.es = False, es
            rest.prev, rest.next = to_map, to_map.next
            if to_map.next is not None:
                to_map.next.prev = rest
            to_map.next = rest
            pool.unmapped[(rest.stream, rest.ptr)] = rest
            to_map.size = mapped
        self._try_merge(to_map, to_map.prev, pool)
        self._try_merge(to_map, to_map.next, pool)
        pool.insert(to_map)
        self.total_allocated_memory += mapped
        self.stats.reserved_bytes.add(mapped)
        self.stats.num_device_alloc += 1
        self._emit("segment_map", ptr0, mapped, to_map.stream)
        return True

    def _unmap_block(self, b: Block, pool: Pool) -> None:
        """``unmap_block`` + ``ExpandableSegment::unmap``: give back every page wholly inside the free
        block; the partial pages at its ends stay mapped as free blocks (``segment_unmap``)."""
        es = b.es
        assert es is not None
        begin = -(-(b.ptr - es.base) // es.page)
        end = (b.ptr + b.size - es.base) // es.page
        if begin >= end:
            return
        ptr, size = es.base + begin * es.page, (end - begin) * es.page
        es.mapped.difference_update(range(begin, end))
        pool.erase(b)
        before = ptr - b.ptr
        if before > 0:
            bf = Block(before, b.ptr, b.stream, b.small)
            bf.es, bf.prev, bf.next = es, b.prev, b
            if b.prev is not None:
                b.prev.next = bf
            b.prev = bf
            pool.insert(bf)
        after = b.size - (before + size)
        if after > 0:
            af = Block(after, ptr + size, b.stream, b.small)
            af.es, af.prev, af.next = es, b, b.next
            if b.next is not None:
                b.next.prev = af
            b.next = af
            pool.insert(af)
        b.ptr, b.size, b.mapped = ptr, size, False
        self._try_merge(b, b.prev, pool)
        self._try_merge(b, b.next, pool)
        pool.unmapped[(b.stream, b.ptr)] = b
        self.total_allocated_memory -= size
        self.stats.reserved_bytes.add(-size)
        self.stats.num_device_free += 1
        self._emit("segment_unmap", ptr, size, b.stream)

    def _release_expandable(self, b: Block, pool: Pool) -> None:
        """``release_expandable_segment``: a segment with nothing mapped is dropped (no trace entry)."""
        del pool.unmapped[(b.stream, b.ptr)]
        self.expandables.remove(b.es)  # type: ignore[arg-type]

    def _page_busy(self, b: Block, delta: int) -> None:
        """Pages of an expandable segment that hold part of a live block (they cannot be unmapped)."""
        es = b.es
        assert es is not None
        first = (b.ptr - es.base) // es.page
        last = (b.ptr + b.size - 1 - es.base) // es.page
        for p in range(first, last + 1):
            k = (id(es), p)
            n = self._page_users.get(k, 0) + delta
            if n == 0:
                self._page_users.pop(k, None)
                self.stats.nonreleasable_bytes.add(-es.page)
            else:
                if n == 1 and delta > 0:
                    self.stats.nonreleasable_bytes.add(es.page)
                self._page_users[k] = n
