"""A run of alloc/free ops through one ``CudaCachingAllocator``, with the common case inlined.

``run_ops(alloc, kinds, tids, sizes, handles, start, end)`` is the loop

    for i in range(start, end):
        if kinds[i]: handles[tids[i]] = alloc.malloc(sizes[i])
        else: alloc.free(handles.pop(tids[i]))

on stream 0, for the epoch simulation (``core/epoch/simulate.py``: ~140,000 calls a plan). Where
the allocator is in its plain state (no trace recorded, no deferred frees pending, no expandable
segments, no garbage-collection threshold under a memory fraction) a malloc that the pool serves and
every free are done here with ``device_caching``'s own rules written out in one function (its
``malloc`` -> ``_get_free_block`` -> ``_alloc_found_block``; ``free`` -> ``_free_block`` ->
``_try_merge``, ``Pool.insert``/``erase``), which saves the calls between them: the same blocks, keys,
addresses and stats. A malloc the pool cannot serve goes to ``alloc.malloc`` (its search changes
nothing when it misses, so it finds the same miss and takes the cudaMalloc / release / retry path).
Outside the plain state every op goes through ``malloc``/``free``. ``tests/core/test_alloc_ops.py``
compares both ways op by op.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from memfit.core.alloc.blocks import K_MIN_BLOCK, K_SMALL_SIZE, Block, round_size


def plain_state(a) -> bool:  # noqa: ANN001
    """Whether ``run_ops`` may take its inlined path (module docstring)."""
    conf = a.conf
    return not (a.record or a.pending or a._lag or conf.expandable_segments  # noqa: SLF001
                or (a.set_fraction and conf.garbage_collection_threshold > 0.0))


def run_ops(a, kinds, tids, sizes, handles: dict, start: int, end: int) -> None:  # noqa: ANN001, C901
    """The ops ``start:end`` (``kinds[i]``: alloc, else free of the tensor ``tids[i]``) through ``a``."""
    if not plain_state(a):
        for i in range(start, end):
            if kinds[i]:
                handles[tids[i]] = a.malloc(sizes[i])
            else:
                a.free(handles.pop(tids[i]))
        return
    conf = a.conf
    small_pool, large_pool = a.small, a.large
    st = a.stats
    s_alloc, s_active, s_req, s_nonrel = st.allocated_bytes, st.active_bytes, st.requested_bytes, st.nonreleasable_bytes
    active = a.active
    divisions = a._divisions  # noqa: SLF001
    mss, nsr = conf.max_split_size, conf.max_non_split_rounding
    # the four stats in locals while the loop runs (written back before a fallback malloc and at the end)
    al_c, al_p, ac_c, ac_p = s_alloc.current, s_alloc.peak, s_active.current, s_active.peak
    rq_c, rq_p, nr_c, nr_p = s_req.current, s_req.peak, s_nonrel.current, s_nonrel.peak
    for kind, tid, orig in zip(kinds[start:end], tids[start:end], sizes[start:end]):
        if kind:
            if orig < K_MIN_BLOCK:
                size = K_MIN_BLOCK
            elif divisions:
                size = round_size(orig, conf)
            else:
                size = (orig + K_MIN_BLOCK - 1) // K_MIN_BLOCK * K_MIN_BLOCK
            small = size <= K_SMALL_SIZE
            pool = small_pool if small else large_pool
            keys = pool.keys
            j = bisect_left(keys, size << 64)  # size_key(0, size): Pool.lower_bound on stream 0
            b = None
            if j < len(keys):
                k = keys[j]
                if not k >> 128:  # a block on stream 0
                    by_key = pool.by_key
                    b = by_key[k]
                    bs = b.size
                    if size < mss <= bs or (size >= mss and bs >= size + nsr):  # get_free_block's oversize rules
                        b = None
            if b is None:  # the pool cannot serve it: malloc's own miss path, with the stats written back
                s_alloc.current, s_alloc.peak, s_active.current, s_active.peak = al_c, al_p, ac_c, ac_p
                s_req.current, s_req.peak, s_nonrel.current, s_nonrel.peak = rq_c, rq_p, nr_c, nr_p
                handles[tid] = a.malloc(orig)
                al_c, al_p, ac_c, ac_p = s_alloc.current, s_alloc.peak, s_active.current, s_active.peak
                rq_c, rq_p, nr_c, nr_p = s_req.current, s_req.peak, s_nonrel.current, s_nonrel.peak
                continue
            del keys[j]
            del by_key[k]
            # alloc_found_block (should_split)
            remaining = bs - size
            if small:
                split = remaining >= K_MIN_BLOCK
            else:
                split = size < mss and remaining > K_SMALL_SIZE
            if split:
                rest = b
                b = Block(size, rest.ptr, 0, small)
                prev = rest.prev
                b.es, b.seg, b.prev, b.next = rest.es, rest.seg, prev, rest
                if prev is not None:
                    prev.next = b
                rest.prev = b
                rest.ptr += size
                rest.size = remaining
                rest.gc_base = pool.gc_calls  # Pool.insert
                rk = (rest.stream << 128) | (remaining << 64) | rest.ptr
                insort(keys, rk)
                by_key[rk] = rest
                bs = size
            b.allocated = True
            b.requested = orig
            active[id(b)] = b
            al_c += bs
            if al_c > al_p:
                al_p = al_c
            ac_c += bs
            if ac_c > ac_p:
                ac_p = ac_c
            rq_c += orig
            if rq_c > rq_p:
                rq_p = rq_c
            seg = b.seg
            seg[1] += 1
            if seg[1] == 1:
                nr_c += seg[0]
                if nr_c > nr_p:
                    nr_p = nr_c
            handles[tid] = b
            continue
        # free (not deferred) -> free_block
        b = handles.pop(tid)
        b.allocated = False
        size0 = b.size
        al_c -= size0
        seg = b.seg
        seg[1] -= 1
        if seg[1] == 0:
            nr_c -= seg[0]
        pool = small_pool if b.small else large_pool
        by_key, keys = pool.by_key, pool.keys
        prev, nxt = b.prev, b.next
        if prev is not None and not prev.allocated and prev.event_count <= 0:  # try_merge_blocks(prev)
            b.ptr = prev.ptr
            b.prev = pp = prev.prev
            if pp is not None:
                pp.next = b
            b.size += prev.size
            pk = (prev.stream << 128) | (prev.size << 64) | prev.ptr  # Pool.erase
            if by_key.pop(pk, None) is not None:
                del keys[bisect_left(keys, pk)]
        if nxt is not None and not nxt.allocated and nxt.event_count <= 0:  # try_merge_blocks(next)
            b.next = nn = nxt.next
            if nn is not None:
                nn.prev = b
            b.size += nxt.size
            nk = (nxt.stream << 128) | (nxt.size << 64) | nxt.ptr
            if by_key.pop(nk, None) is not None:
                del keys[bisect_left(keys, nk)]
        active.pop(id(b), None)
        b.gc_base = pool.gc_calls  # Pool.insert
        bk = (b.stream << 128) | (b.size << 64) | b.ptr
        insort(keys, bk)
        by_key[bk] = b
        ac_c -= size0
        rq_c -= b.requested
    s_alloc.current, s_alloc.peak, s_active.current, s_active.peak = al_c, al_p, ac_c, ac_p
    s_req.current, s_req.peak, s_nonrel.current, s_nonrel.peak = rq_c, rq_p, nr_c, nr_p
