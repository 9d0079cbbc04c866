"""Everything a real run recorded for one rank, indexed by phase: the stats file's phases, the
DeepSpeed log's reports, the snapshot's device trace replayed, and the nvidia-smi samples of its GPU.
Read by the reconciliation (``reconcile``) and the memory-over-time chart (``timeline``)."""

from __future__ import annotations

from memfit.core.compare.trace import TraceReplay, peak_in, replay_levels
from memfit.core.ledger_types import Plan
from memfit.core.records.types import PhaseStats, RecordSet, SmiSample


class RecordedRun:
    """Everything recorded for one rank, indexed by phase."""

    def __init__(self, plan: Plan, records: RecordSet, rank: int) -> None:
        self.plan, self.records, self.rank = plan, records, rank
        self.notes: list[str] = []
        self.stats = records.stats_for(rank)
        self.snapshot = records.snapshot_for(rank)
        self.occ: dict[str, list[PhaseStats]] = {}
        for ph in (self.stats.phases if self.stats else ()):
            self.occ.setdefault(ph.name, []).append(ph)
        self.windows = {n: [(p.t_start_us, p.t_end_us) for p in ps if p.t_start_us is not None and p.t_end_us is not None]
                        for n, ps in self.occ.items()}
        self.ds = [ln for log in records.ds_logs for ln in log.lines if (ln.rank if ln.rank is not None else 0) == rank]
        if records.ds_logs and not self.ds:
            self.notes.append(f"the DeepSpeed log has no reports from rank {rank} (DeepSpeed prints them on rank 0 only)")
        self.device, self.replay = self._trace()
        self.smi = self._smi()

    def _trace(self) -> tuple[int, TraceReplay | None]:
        snap = self.snapshot
        if snap is None or not snap.traces:
            if snap is not None:
                self.notes.append(f"{snap.path}: no device trace (history was not recorded): its segments are the "
                                  "state at the dump only")
            return 0, None
        trace = max(snap.traces, key=lambda t: len(t.events))
        if len(snap.traces) > 1:
            self.notes.append(f"{snap.path}: traces for devices {[t.device for t in snap.traces]}; device {trace.device} "
                              "(the most events) is compared")
        replay = replay_levels(snap, trace.device)
        self.notes.extend(replay.notes)
        if not replay.consistent:
            return trace.device, None
        if self.windows and not any(e.time_us for e in replay.events):
            self.notes.append(f"{snap.path}: trace entries carry no time_us (torch < 2.1): placed in no phase")
        elif self.windows:
            spans = [w for ws in self.windows.values() for w in ws]
            lo, hi = min(w[0] for w in spans), max(w[1] for w in spans)
            if not any(e.time_us is not None and lo <= e.time_us < hi for e in replay.events):
                self.notes.append(f"{snap.path}: none of its trace entries falls inside the recorded phases "
                                  "(its time_us and the stats file's clocks disagree): trace figures are shown for the "
                                  "whole run only")
        return trace.device, replay

    def _smi(self) -> list[SmiSample]:
        samples = [s for rec in self.records.smi for s in rec.samples]
        if not samples:
            return []
        gpus = sorted({s.gpu for s in samples})
        gpu = gpus[0] if len(gpus) == 1 else self.rank
        if len(gpus) > 1:
            self.notes.append(f"nvidia-smi lists GPUs {gpus}: GPU {gpu} is taken to be rank {self.rank}'s (local rank = GPU index)")
        return [s for s in samples if s.gpu == gpu]

    # ------------------------------------------------------------------ recorded figures per phase

    def trace_window(self, t0: int, t1: int) -> tuple[int, int, int | None] | None:
        """(peak live, peak reserved, event index at the live peak; -1: the level at entry)."""
        r = self.replay
        if r is None:
            return None
        times = [e.time_us for e in r.events]
        i = next((k for k, t in enumerate(times) if t is not None and t >= t0), len(times))
        j = next((k for k in range(i, len(times)) if times[k] is not None and times[k] >= t1), len(times))
        live, at, res = peak_in(r, i, j)
        return live, res, (at if at is not None else i - 1)

    def smi_window(self, t0: int, t1: int) -> tuple[int, int] | None:
        off = self.stats.utc_offset_s if self.stats else None
        if off is None:
            return None
        lo, hi = t0 + off * 1_000_000, t1 + off * 1_000_000
        inside = [s.used_bytes for s in self.smi if s.local_time_us is not None and lo <= s.local_time_us < hi]
        return (max(inside), len(inside)) if inside else None
