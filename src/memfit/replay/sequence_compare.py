"""The ledger's alloc/free sequence against a replay's recorded one, tensor by tensor and through the
CUDA caching allocator (issue 19 item 3).

A replay recorded with ``ReplaySpec.alloc_sequence`` (tests/fixtures/replay_sequence/, recorded by
``python -m memfit.replay.deepspeed.record_fixtures --sequence`` and ``python -m
memfit.replay.pytorch.record_fixtures --sequence``) holds every host tensor its CPU allocator reported
from the first forward to the end of the last optimizer step (``Measurement.alloc_sequence``). On the
CPU accelerator those are what the run holds on "the device" and on the host together, so the ledger's
sequence is taken the same way: the plan of the replay's own scenario (``replay.compare.scenario_of``:
the CPU accelerator, so ``pin_memory()`` copies nothing and ``.to(device)`` moves nothing, as in the
replay), every tensor line but the process's own memory (``runtime`` lines: interpreter, libraries,
CUDA context) and NVMe.

``compare_sequences`` returns, per phase both have, the tensors each allocated, how many the other
has with the same size (in order, and as a multiset of the tensors kept through the phase), and both
sequences' allocated, reserved and OOM-relevant peaks through ``CudaCachingAllocator`` (default
``PYTORCH_CUDA_ALLOC_CONF``, one stream, no capacity limit). No torch here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from memfit.core.alloc.sequence import AllocSequence, align, from_timeline, simulate
from memfit.core.ledger_types import Device
from memfit.replay.measurement import Measurement


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseSequence:
    phase: str
    ledger_tensors: int
    recorded_tensors: int
    matched_in_order: int
    ledger_bytes: int
    recorded_bytes: int
    kept_ledger_bytes: int
    """Bytes of the tensors the ledger allocates in the phase and keeps past its end."""
    kept_recorded_bytes: int
    kept_matched_bytes: int
    """Of those, the bytes of tensors both have with the same size (multiset intersection)."""
    ledger_allocated_bytes: int
    recorded_allocated_bytes: int
    ledger_reserved_bytes: int
    recorded_reserved_bytes: int
    ledger_oom_relevant_bytes: int
    recorded_oom_relevant_bytes: int
    ledger_requested_bytes: int
    recorded_requested_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SequenceComparison:
    name: str
    phases: tuple[PhaseSequence, ...]
    live_ledger_bytes: int
    live_recorded_bytes: int
    live_matched_bytes: int
    ledger: AllocSequence
    recorded: AllocSequence

    def phase(self, name: str) -> PhaseSequence:
        return next(p for p in self.phases if p.phase == name)


def ledger_sequence(m: Measurement) -> AllocSequence:
    """The ledger's tensors over the phases the replay recorded (see the module docstring)."""
    from memfit.core.ledger.build import build_timeline
    from memfit.replay.compare import scenario_of

    sc = scenario_of(m)
    t = build_timeline(sc)
    known = [n for n, _ in t.phase_starts]
    phases = [n for n, _ in m.alloc_sequence.marks if n in known]  # type: ignore[union-attr]
    first, last = known.index(phases[0]), known.index(phases[-1])
    return from_timeline(t.events, t.phase_starts, known[first:last + 1],
                         include=lambda key, dev: t.item(key).category != "runtime" and dev is not Device.NVME)


def _kept(seq: AllocSequence, phase: str) -> Counter:
    start, end = seq.phase_range(phase)
    freed = {~n for n in seq.ops[start:end] if n < 0}
    return Counter(n for tid, n in seq.allocations(phase) if tid not in freed)


def compare_sequences(m: Measurement) -> SequenceComparison:
    if m.alloc_sequence is None:
        raise ValueError(f"{m.spec.name}: the replay kept no allocation sequence (ReplaySpec.alloc_sequence)")
    rec = m.alloc_sequence
    led = ledger_sequence(m)
    names = [n for n, _ in led.marks if n in {r for r, _ in rec.marks}]
    a = align(led, rec, names)
    sim_l, sim_r = simulate(led), simulate(rec)
    out = []
    for pa in a.phases:
        kl, kr = _kept(led, pa.phase), _kept(rec, pa.phase)
        sl, sr = sim_l.phase(pa.phase), sim_r.phase(pa.phase)
        out.append(PhaseSequence(
            phase=pa.phase, ledger_tensors=len(pa.matched) + len(pa.ledger_unmatched),
            recorded_tensors=len(pa.matched) + len(pa.recorded_unmatched), matched_in_order=len(pa.matched),
            ledger_bytes=pa.ledger_bytes, recorded_bytes=pa.recorded_bytes,
            kept_ledger_bytes=sum(n * c for n, c in kl.items()), kept_recorded_bytes=sum(n * c for n, c in kr.items()),
            kept_matched_bytes=sum(n * c for n, c in (kl & kr).items()),
            ledger_allocated_bytes=sl.allocated_peak_bytes, recorded_allocated_bytes=sr.allocated_peak_bytes,
            ledger_reserved_bytes=sl.reserved_peak_bytes, recorded_reserved_bytes=sr.reserved_peak_bytes,
            ledger_oom_relevant_bytes=sl.oom_relevant_peak_bytes, recorded_oom_relevant_bytes=sr.oom_relevant_peak_bytes,
            ledger_requested_bytes=sl.requested_peak_bytes, recorded_requested_bytes=sr.requested_peak_bytes))
    return SequenceComparison(name=m.spec.name, phases=tuple(out), live_ledger_bytes=a.live_ledger_bytes,
                              live_recorded_bytes=a.live_recorded_bytes, live_matched_bytes=a.live_matched_bytes,
                              ledger=led, recorded=rec)
