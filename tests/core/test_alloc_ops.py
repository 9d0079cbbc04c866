"""``core/alloc/ops.py``'s inlined loop against the allocator's own ``malloc``/``free``, op by op.

Random runs of allocs and frees (small, 1-10 MiB and large requests; a card small enough that the
allocator releases cached blocks, retries and runs out of memory) go through two allocators, one
with ``run_ops`` in random chunks, one with ``malloc``/``free`` one at a time; after every chunk
both must hold the same blocks (each tensor's address, size and request), the same pools (keys in
order), the same segments and the same stats, peaks included (reset between chunks, as the epoch
resets them between phases)."""

import random

import pytest

from memfit.core.alloc.conf import parse_alloc_conf
from memfit.core.alloc.cuda_caching import CudaCachingAllocator
from memfit.core.alloc.ops import plain_state, run_ops
from memfit.core.alloc.versions import resolve_torch_version

MiB = 2**20
V213 = resolve_torch_version("2.13")


def _ops(rng: random.Random, n: int):
    kinds, tids, sizes, live, nxt = [], [], [], [], 0
    for _ in range(n):
        if live and rng.random() < 0.45:
            tid = live.pop(rng.randrange(len(live)) if rng.random() < 0.5 else len(live) - 1)
            kinds.append(False), tids.append(tid), sizes.append(0)
            continue
        r = rng.random()
        size = (rng.randrange(1, 4096) if r < 0.2 else rng.randrange(4096, MiB + 1) if r < 0.5 else
                rng.randrange(MiB, 10 * MiB) if r < 0.7 else rng.randrange(10 * MiB, 300 * MiB))
        kinds.append(True), tids.append(nxt), sizes.append(size)
        live.append(nxt)
        nxt += 1
    return tuple(kinds), tuple(tids), tuple(sizes)


def _state(a, handles):
    s = a.stats
    stats = tuple((x.current, x.peak) for x in (s.allocated_bytes, s.reserved_bytes, s.active_bytes, s.requested_bytes,
                                                s.segment, s.nonreleasable_bytes))
    counters = (s.num_alloc_retries, s.num_ooms, s.num_device_alloc, s.num_device_free, s.num_sync_all_streams)
    blocks = {t: (b.ptr, b.size, b.requested, b.allocated) for t, b in handles.items()}
    pools = tuple((tuple(p.keys), tuple(sorted(p.by_key)), tuple(b.gc_base for _, b in sorted(p.by_key.items())))
                  for p in (a.small, a.large))
    return stats, counters, blocks, pools, a.segments(), len(a.active), a.total_allocated_memory


@pytest.mark.parametrize("text", ["", "max_split_size_mb:128", "max_split_size_mb:40,max_non_split_rounding_mb:64",
                                  "roundup_power2_divisions:4", "roundup_power2_divisions:[256:1,512:2,>:8]",
                                  "expandable_segments:True",
                                  "garbage_collection_threshold:0.6,per_process_memory_fraction:0.9"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_run_ops_is_malloc_and_free_one_by_one(text, seed):
    rng = random.Random(seed)
    conf = parse_alloc_conf(text, V213)
    cap = rng.choice((None, 3 * 2**30, 1536 * MiB))
    kinds, tids, sizes = _ops(rng, 4000)
    fast, slow = (CudaCachingAllocator(conf, capacity_bytes=cap, device_total_bytes=4 * 2**30, force_on_oom=True)
                  for _ in range(2))
    assert plain_state(fast) == (not text.startswith(("expandable", "garbage")))
    hf: dict = {}
    hs: dict = {}
    i = 0
    while i < len(kinds):
        j = min(i + rng.randrange(1, 300), len(kinds))
        if rng.random() < 0.05:
            fast.empty_cache(), slow.empty_cache()
        fast.stats.reset_peaks(), slow.stats.reset_peaks()
        run_ops(fast, kinds, tids, sizes, hf, i, j)
        for k in range(i, j):
            if kinds[k]:
                hs[tids[k]] = slow.malloc(sizes[k])
            else:
                slow.free(hs.pop(tids[k]))
        assert _state(fast, hf) == _state(slow, hs), f"ops {i}:{j}"
        i = j
    assert slow.stats.num_ooms or cap is None or slow.stats.num_alloc_retries or slow.stats.num_device_free
