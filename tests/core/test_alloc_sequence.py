"""Alloc/free sequences (``core/alloc/sequence.py``): the ledger's tensors read back from a timeline as
``Timeline`` resolves its frees, the in-order matching, the CUDA allocator simulation of a sequence,
the replay's recorded sequence built from profiler reports (``replay/host_tracker.alloc_sequence``), the
simulator's deferred (``record_stream``) frees, and ZeRO-3's side streams in a CUDA plan."""

from __future__ import annotations

from memfit.core.alloc.cuda_caching import CudaCachingAllocator
from memfit.core.alloc.sequence import AllocSequence, align, from_timeline, simulate
from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger_types import Device
from memfit.replay.host_tracker import AllocEvent, Mark, PinEvent, alloc_sequence, chain_order

MiB = 2**20


def _timeline() -> Timeline:
    t = Timeline(ranks_per_node=1, accelerator="cpu")
    for key in ("a", "b"):
        t.declare(key, name=key, device=Device.GPU, formula="", source="")
    t.phase("load", "")
    t.alloc("a", 100)
    t.alloc("a", 200)
    t.phase("forward", "")
    t.alloc("b", 10)
    t.alloc("b", 20)
    t.alloc("b", 10)
    t.free("b", 10)      # the most recent 10-byte tensor of b
    t.free("a", 150)     # part of a lump: the 200-byte tensor goes, 50 bytes are made again
    t.phase("backward", "")
    t.free("b")          # all of b
    t.alloc("a", 7)
    return t


def test_ledger_sequence_resolves_frees_as_the_timeline_does():
    t = _timeline()
    s = from_timeline(t.events, t.phase_starts, ["forward", "backward"])
    assert s.live == (100, 200) and s.marks == (("forward", 0), ("backward", 6))
    # ids: 0, 1 live; 2 (10), 3 (20), 4 (10); free 4; free 1 and re-make 50 as 5; then free 3, 2; alloc 7 as 6
    assert s.ops == (10, 20, 10, ~4, ~1, 50, ~3, ~2, 7)
    assert s.keys == ("a", "a", "b", "b", "b", "a", "a")
    assert [n for _, n in s.allocations("forward")] == [10, 20, 10, 50]
    assert s.phase_range("backward") == (6, 9)
    # a filter leaves other keys out
    only_b = from_timeline(t.events, t.phase_starts, ["forward"], include=lambda k, d: k == "b")
    assert only_b.live == () and only_b.ops == (10, 20, 10, ~2)


def test_round_trip_and_sizes():
    s = AllocSequence(live=(5,), ops=(7, ~0, 9), marks=(("forward", 0),), pinned=(1,), source="x")
    assert AllocSequence.from_dict(s.to_dict()) == s
    assert s.sizes == [5, 7, 9]


def test_matching_is_in_order_and_by_size():
    led = AllocSequence(live=(), ops=(4, 8, 8, 16), marks=(("forward", 0),))
    rec = AllocSequence(live=(), ops=(8, 4, 99, 8, 16, 8), marks=(("forward", 0),))
    (p,) = align(led, rec).phases
    # 4 is matched first (position 1), so the first 8 (position 0) cannot be used afterwards
    assert p.matched == ((0, 1), (1, 3), (2, 5)) and p.ledger_unmatched == (3,)
    assert p.matched_bytes == 20 and p.ledger_bytes == 36 and p.recorded_bytes == 143


def test_simulation_counts_segments_per_phase():
    """Two 1.5 MiB tensors share one 20 MiB segment (1-10 MiB requests); a 30 MiB one gets its own."""
    s = AllocSequence(live=(3 * MiB // 2,), ops=(3 * MiB // 2, ~1, 30 * MiB), marks=(("forward", 0), ("backward", 2)))
    sim = simulate(s)
    assert sim.start_reserved_bytes == 20 * MiB
    f, b = sim.phases
    assert (f.reserved_peak_bytes, f.allocated_peak_bytes, f.requested_peak_bytes) == (20 * MiB, 3 * MiB, 3 * MiB)
    assert b.reserved_peak_bytes == 50 * MiB and b.oom_relevant_peak_bytes == 50 * MiB
    assert simulate(s, skip={2}).phase("backward").reserved_peak_bytes == 20 * MiB


def test_recorded_sequence_from_profiler_reports():
    """Reports at one timestamp are ordered by the allocator's running total; tensors live when the first
    window opens are the sequence's ``live``; frees of storages from before the tracker are ignored; a pin
    marks the allocation live at its pointer."""
    ev = [AllocEvent(10, 0xA, 100, "cpu", 100), AllocEvent(11, 0xB, 50, "cpu", 150),
          AllocEvent(20, 0xC, 30, "cpu", 180), AllocEvent(20, 0xC, -30, "cpu", 150),  # same ns: chain decides
          AllocEvent(21, 0xD, -8, "cpu", 142),  # never seen allocated
          AllocEvent(30, 0xB, -50, "cpu", 92), AllocEvent(31, 0xE, 70, "cpu", 162),
          AllocEvent(40, 0xF, 1, "cpu", 163)]
    shuffled = [ev[3], ev[2], *ev[:2], *ev[4:]]
    assert [e.delta_bytes for e in chain_order(shuffled)] == [e.delta_bytes for e in ev]
    marks = [Mark(5, 0), Mark(15, 1), Mark(25, 2), Mark(35, 3)]
    s = alloc_sequence(shuffled, marks, [PinEvent(32, 0xE)], [("forward", 1), ("backward", 2)])
    assert s.live == (100, 50)
    assert s.ops == (30, ~2, ~1, 70) and s.marks == (("forward", 0), ("backward", 2))
    assert s.pinned == (3,)


def test_deferred_free_waits_one_malloc():
    """``free(deferred=True)`` (a block used on another stream, ``record_stream``): with ``event_lag`` 1 the
    next malloc cannot reuse it, the one after can."""
    sim = CudaCachingAllocator()
    sim.event_lag = 1
    b = sim.malloc(30 * MiB)
    sim.free(b, deferred=True)
    c = sim.malloc(30 * MiB)
    assert c.ptr != b.ptr and sim.stats.reserved_bytes.current == 60 * MiB
    d = sim.malloc(30 * MiB)
    assert d.ptr == b.ptr and sim.stats.reserved_bytes.current == 60 * MiB


def test_side_stream_blocks_serve_only_their_stream():
    sim = CudaCachingAllocator()
    b = sim.malloc(30 * MiB, 1)
    sim.free(b)
    assert sim.malloc(30 * MiB, 0).ptr != b.ptr
    assert sim.malloc(30 * MiB, 1).ptr == b.ptr


def test_zero3_overlap_comm_puts_gathers_on_the_allgather_stream():
    """A CUDA plan of ZeRO-3 with overlap_comm (DeepSpeed 0.19): gathered params and the coalesced
    flat buffers are all-gather-stream blocks, the reduce-scatter's flat input a reduce-stream block
    (``core/ledger/deepspeed/streams.py``); without overlap_comm everything is on stream 0."""
    import dataclasses

    from memfit.core.ledger.build import build_timeline
    from memfit.core.ledger.deepspeed.streams import ALLGATHER_STREAM, REDUCE_STREAM
    from memfit.core.ledger.deepspeed.zero3_fetch import GATHERED
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.inputs import ScenarioInputs

    ds = {"zero_optimization": {"stage": 3, "overlap_comm": True}, "bf16": {"enabled": True},
          "train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
    import json
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(ds, fh)
    inputs = ScenarioInputs(model="gpt2", deepspeed=fh.name, gpus="2xa100-80gb", seq_len=128)
    t = build_timeline(build_scenario(inputs))
    assert t.streams.get(GATHERED) == ALLGATHER_STREAM and REDUCE_STREAM in t.streams.values()
    gpu = t.tracker.gpu
    streams = {b.stream for b in gpu.active.values()} | {b.stream for b in gpu.large.by_key.values()}
    assert ALLGATHER_STREAM in streams
    ds["zero_optimization"]["overlap_comm"] = False
    with open(fh.name, "w", encoding="utf-8") as out:
        json.dump(ds, out)
    t2 = build_timeline(build_scenario(dataclasses.replace(inputs)))
    assert not t2.streams and not t2.deferred_frees
