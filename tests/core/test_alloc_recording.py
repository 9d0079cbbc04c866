"""check_against_recording on hand-built traces in the documented format of
torch.cuda.memory._snapshot()["device_traces"] (the TraceEntry TypedDict in torch/cuda/memory.py:
action, addr, size, stream; device_free for oom). Addresses are what a GPU might return."""

import pytest

from memfit.core.alloc.conf import parse_alloc_conf
from memfit.core.alloc.cuda_caching import TraceEvent, check_against_recording
from memfit.core.alloc.recording import RecordingConfig
from memfit.core.alloc.versions import resolve_torch_version
from memfit.errors import MemfitError

MiB = 2**20
A, B, C = 0x7F3A_0000_0000, 0x7F3A_4000_0000, 0x7F3A_8000_0000


def ev(action, addr, size, stream=0, **extra):
    return {"action": action, "addr": addr, "size": size, "stream": stream, "frames": [], **extra}


def test_a_recording_the_simulator_reproduces():
    """A 3 MiB request gets a 20 MiB segment at A; a 1000 B one a 2 MiB small segment at B; after the
    3 MiB block is freed, a 5 MiB request reuses the 20 MiB segment's front (best fit, split)."""
    trace = [
        ev("segment_alloc", A, 20 * MiB), ev("alloc", A, 3 * MiB),
        ev("segment_alloc", B, 2 * MiB), ev("alloc", B, 1000),
        ev("free_requested", A, 3 * MiB), ev("free_completed", A, 3 * MiB),
        ev("alloc", A, 5 * MiB),
        ev("alloc", A + 5 * MiB, 12 * MiB),
        ev("snapshot", 0, 0),
    ]
    check = check_against_recording(trace)
    assert check.divergences == ()
    assert check.recorded_reserved_peak_bytes == check.simulated_reserved_peak_bytes == 22 * MiB
    assert check.matches and check.events_replayed == 8


def test_a_divergence_is_reported():
    """Recorded under max_split_size_mb:100: the 120 MiB request does not take the cached 150 MiB
    block (150 >= 120 + 20) and gets its own segment. Checked with the default config, the simulator
    splits the 150 MiB block instead: the missing segment_alloc and the other address are reported.
    With the config the run had, it matches."""
    trace = [
        ev("segment_alloc", A, 150 * MiB), ev("alloc", A, 150 * MiB),
        ev("free_requested", A, 150 * MiB), ev("free_completed", A, 150 * MiB),
        ev("segment_alloc", B, 120 * MiB), ev("alloc", B, 120 * MiB),
    ]
    wrong = check_against_recording(trace)
    assert not wrong.matches
    msgs = [d.message for d in wrong.divergences]
    assert len(wrong.divergences) == 2
    assert "the recording shows segment_alloc of 125,829,120 B" in msgs[0] and wrong.divergences[0].index == 4
    assert "recorded at" in msgs[1] and wrong.divergences[1].index == 5
    assert (wrong.recorded_reserved_peak_bytes, wrong.simulated_reserved_peak_bytes) == (270 * MiB, 150 * MiB)
    conf = parse_alloc_conf("max_split_size_mb:100", resolve_torch_version("2.13"))
    assert check_against_recording(trace, RecordingConfig(conf=conf)).matches


def test_deferred_free_and_empty_cache():
    """A block used on a side stream is freed (free_requested) but completes later; until then a
    same-size request needs a new segment. empty_cache() then returns both unsplit segments."""
    trace = [
        ev("segment_alloc", A, 12 * MiB), ev("alloc", A, 12 * MiB),
        ev("free_requested", A, 12 * MiB),
        ev("segment_alloc", B, 12 * MiB), ev("alloc", B, 12 * MiB),
        ev("free_completed", A, 12 * MiB),
        ev("free_requested", B, 12 * MiB), ev("free_completed", B, 12 * MiB),
        ev("segment_free", A, 12 * MiB), ev("segment_free", B, 12 * MiB),
    ]
    assert check_against_recording(trace).matches


def test_oom_recording_infers_the_capacity():
    """At the oom entry the recording holds 70 MiB reserved and CUDA reported 30 MiB free: capacity
    100 MiB. The simulator, given it, also flushes the cached 60 MiB segment for the 70 MiB request
    (a retry) and runs out on the 40 MiB one."""
    trace = [
        ev("segment_alloc", A, 60 * MiB), ev("alloc", A, 60 * MiB),
        ev("free_requested", A, 60 * MiB), ev("free_completed", A, 60 * MiB),
        ev("segment_free", A, 60 * MiB), ev("segment_alloc", B, 70 * MiB), ev("alloc", B, 70 * MiB),
        {"action": "oom", "device_free": 30 * MiB, "size": 40 * MiB, "stream": 0},
    ]
    check = check_against_recording(trace)
    assert check.capacity_bytes == 100 * MiB
    assert check.matches, check.divergences


def test_typed_events_and_expandable_segments():
    conf = parse_alloc_conf("expandable_segments:True", resolve_torch_version("2.13"))
    trace = [TraceEvent("segment_map", C, 40 * MiB), TraceEvent("alloc", C, 25 * MiB),
             TraceEvent("alloc", C + 25 * MiB, 5 * MiB),
             TraceEvent("free_requested", C, 25 * MiB), TraceEvent("free_completed", C, 25 * MiB),
             TraceEvent("segment_unmap", C, 20 * MiB)]
    check = check_against_recording(trace, RecordingConfig(conf=conf, device_total_bytes=24 * 2**30))
    assert check.matches, check.divergences
    trace[-1] = TraceEvent("segment_unmap", C, 40 * MiB)   # what no allocator would do: reported
    assert len(check_against_recording(trace, RecordingConfig(conf=conf)).divergences) == 1


def test_unknown_action_is_bad_input():
    with pytest.raises(MemfitError, match="unknown trace action"):
        check_against_recording([ev("segment_grow", A, 1)])
