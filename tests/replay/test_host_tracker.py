"""The host tracker is byte-exact: checked on real torch allocations of known sizes."""

from __future__ import annotations

import pytest

from memfit.replay.host_tracker import AllocEvent, HostTracker, Mark, PinEvent, downsample, summarize

torch = pytest.importorskip("torch")


def _nbytes(t) -> int:
    return t.untyped_storage().nbytes()


def test_tracker_live_and_peak_match_real_tensor_sizes():
    tracker = HostTracker()
    tracker.start()
    w0 = tracker.mark()
    a = torch.empty(1000, dtype=torch.float32)
    b = torch.empty(333, dtype=torch.float16)
    c = torch.zeros(250_000, dtype=torch.float64)
    sizes_w0 = [_nbytes(a), _nbytes(b), _nbytes(c)]
    del c  # freed inside window 0: the peak keeps it, the end does not
    w1 = tracker.mark()
    d = torch.ones(4096, dtype=torch.bfloat16)
    e = torch.empty((7, 13), dtype=torch.int64)
    size_d, size_e = _nbytes(d), _nbytes(e)
    del a
    w2 = tracker.mark()
    tracker.note_pinned(d)  # the tracker classes d as pinned for its whole life
    result = tracker.stop()

    assert sizes_w0 == [4000, 666, 2_000_000]  # what torch says the storages hold
    by = {w.index: w for w in result.windows}
    assert by[w0].host_live_start_bytes == 0
    assert by[w0].host_peak_bytes == sum(sizes_w0)
    assert by[w0].host_live_end_bytes == sizes_w0[0] + sizes_w0[1]
    live_w1_peak = sizes_w0[0] + sizes_w0[1] + size_d + size_e
    assert by[w1].host_peak_bytes == live_w1_peak
    assert by[w1].host_live_end_bytes == live_w1_peak - sizes_w0[0]
    assert by[w1].host_peak_pinned_bytes == size_d
    assert by[w1].host_peak_pageable_bytes == live_w1_peak - size_d
    assert by[w2].host_pinned_end_bytes == size_d
    assert result.unmatched_pins == 0
    del b, d, e


def test_tracker_sees_allocations_made_inside_cpp_ops():
    """A matmul's output and an in-place resize come from ATen, not Python."""
    x = torch.randn(64, 64)
    tracker = HostTracker()
    tracker.start()
    w = tracker.mark()
    y = x @ x
    z = torch.empty(10, dtype=torch.float32)
    z.resize_(100_000)
    result = tracker.stop()
    win = result.windows[w]
    assert win.host_live_end_bytes == _nbytes(y) + _nbytes(z)
    assert win.host_peak_bytes >= win.host_live_end_bytes


def test_frees_of_storages_older_than_the_tracker_are_ignored():
    old = torch.empty(10_000, dtype=torch.float32)
    tracker = HostTracker()
    tracker.start()
    tracker.mark()
    del old
    new = torch.empty(10, dtype=torch.float32)
    result = tracker.stop()
    assert result.windows[0].host_live_end_bytes == _nbytes(new)
    assert result.windows[0].host_live_start_bytes == 0


def test_summarize_pins_retroactively_and_splits_devices():
    events = [
        AllocEvent(t_ns=10, ptr=1, delta_bytes=100, device="cpu"),
        AllocEvent(t_ns=20, ptr=2, delta_bytes=50, device="cpu"),
        AllocEvent(t_ns=30, ptr=9, delta_bytes=512, device="cuda"),
        AllocEvent(t_ns=40, ptr=1, delta_bytes=-100, device="cpu"),
        AllocEvent(t_ns=50, ptr=1, delta_bytes=70, device="cpu"),  # same address, new allocation
    ]
    marks = [Mark(t_ns=0, index=0), Mark(t_ns=35, index=1)]
    pins = [PinEvent(t_ns=25, ptr=2), PinEvent(t_ns=60, ptr=777)]
    result = summarize(events, marks, pins, num_windows=2)
    w0, w1 = result.windows
    assert (w0.host_peak_bytes, w0.host_peak_pinned_bytes, w0.device_peak_bytes) == (150, 50, 512)
    assert (w1.host_live_start_bytes, w1.host_live_end_bytes, w1.host_pinned_end_bytes) == (150, 120, 50)
    assert w1.host_peak_bytes == 150  # the window's start value counts toward its peak
    assert result.unmatched_pins == 1


def test_window_never_reached_is_absent():
    result = summarize([AllocEvent(t_ns=5, ptr=1, delta_bytes=8, device="cpu")], [Mark(t_ns=0, index=0)], [],
                       num_windows=3)
    assert [w.index for w in result.windows] == [0]


def test_downsample_keeps_peaks_and_window_edges():
    from memfit.replay.host_tracker import Sample

    samples = tuple(Sample(t_ns=i, window=i // 500, host_live_bytes=(i * 7919) % 1009, host_pinned_bytes=0,
                           device_live_bytes=(i * 104729) % 997) for i in range(5000))
    kept = downsample(samples, 200)
    assert len(kept) < 400
    assert max(s.host_live_bytes for s in kept) == max(s.host_live_bytes for s in samples)
    assert max(s.device_live_bytes for s in kept) == max(s.device_live_bytes for s in samples)
    for window in range(10):
        in_window = [s for s in samples if s.window == window]
        assert in_window[0] in kept and in_window[-1] in kept
