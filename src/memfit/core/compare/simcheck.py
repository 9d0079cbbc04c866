"""The CUDA caching allocator simulator checked against a recorded alloc/free sequence (BRIEF contract 4).

``memfit.core.alloc.cuda_caching.check_against_recording(events, config)`` (the ``alloc`` helper's
simulator) replays ``events`` (``TraceEvent(action, addr, size, stream)``, from
``memfit.core.compare.trace.allocator_events``) and lists every event where its segment layout
differs from the recorded one, with both reserved peaks. When this memfit has no simulator the
check says so and still reports the recorded reserved peak and whether the trace could be checked.

A trace can be checked exactly only if it starts from an empty allocator: nothing live and nothing
reserved before its first event (``memfit.record`` starts recording before the first CUDA
allocation). Otherwise the simulator would start from a layout it cannot know.
"""

from __future__ import annotations

from memfit.core.compare.trace import allocator_events, replay_levels
from memfit.core.compare.types import SimulatorCheck
from memfit.core.records.types import MemorySnapshot


def _simulator():
    try:
        from memfit.core.alloc.cuda_caching import check_against_recording
    except ImportError:
        return None
    return check_against_recording


def simulator_config(snapshot: MemorySnapshot, torch_version: str | None = None) -> tuple[object | None, str]:
    """(the simulator's configuration for this recording, why it could not be given). ``None`` is the
    simulator's default, which is torch's when the snapshot shows no PYTORCH_CUDA_ALLOC_CONF setting.
    The setting is read as the recording's torch (the stats file's ``torch_version``) reads it."""
    a = snapshot.allocator
    text = (a.conf or "").strip() if a is not None else ""
    if not text:
        if a is not None and a.expandable_segments:
            text = "expandable_segments:True"
        else:
            return None, ""
    try:
        from memfit.core.alloc.conf import parse_alloc_conf
        from memfit.core.alloc.versions import resolve_torch_version
    except ImportError:
        return None, "no allocator configuration reader in this memfit"
    from memfit.errors import MemfitError

    try:
        version = resolve_torch_version(".".join((torch_version or "").split("+")[0].split(".")[:2]) or None)
        return parse_alloc_conf(text, version), ""
    except MemfitError as exc:
        return None, f"the recording's allocator settings ({text!r}) could not be read for the simulator: {exc}"


def check_snapshot(snapshot: MemorySnapshot, *, rank: int, device: int, torch_version: str | None = None) -> SimulatorCheck:
    events = allocator_events(snapshot, device)
    if not events:
        return SimulatorCheck(rank=rank, device=device, status="no trace", events=0, recorded_reserved_peak_bytes=None,
                              reason="the snapshot has no device trace (record with _record_memory_history(enabled='all'))")
    levels = replay_levels(snapshot, device)
    recorded_peak = max([levels.reserved_start, *levels.reserved]) if levels.consistent else None
    if not levels.consistent:
        return SimulatorCheck(rank=rank, device=device, status="not exact", events=len(events),
                              recorded_reserved_peak_bytes=None, reason=levels.notes[0])
    if levels.live_start or levels.reserved_start:
        return SimulatorCheck(rank=rank, device=device, status="not exact", events=len(events),
                              recorded_reserved_peak_bytes=recorded_peak,
                              reason=f"the trace starts with {levels.reserved_start:,} B already reserved and "
                                     f"{levels.live_start:,} B live: the simulator cannot know that layout")
    check = _simulator()
    if check is None:
        return SimulatorCheck(rank=rank, device=device, status="unavailable", events=len(events),
                              recorded_reserved_peak_bytes=recorded_peak,
                              reason="this memfit has no CUDA caching allocator simulator "
                                     "(memfit.core.alloc.cuda_caching.check_against_recording)")
    config, problem = simulator_config(snapshot, torch_version)
    if problem:
        return SimulatorCheck(rank=rank, device=device, status="not exact", events=len(events),
                              recorded_reserved_peak_bytes=recorded_peak, reason=problem)
    result = check(events, config)
    divergences = tuple(getattr(d, "message", str(d)) for d in getattr(result, "divergences", ()))
    simulated = getattr(result, "simulated_reserved_peak_bytes", None)
    recorded = getattr(result, "recorded_reserved_peak_bytes", recorded_peak)
    return SimulatorCheck(rank=rank, device=device, status="checked", events=len(events),
                          recorded_reserved_peak_bytes=recorded, simulated_reserved_peak_bytes=simulated,
                          divergences=divergences)
