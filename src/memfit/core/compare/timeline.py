"""Memory over the run on the phase axis: the plan's step line and the recording's curves under it.

Columns are the recorded phase occurrences in time order (each step's forward is its own column);
a point at time t inside column i's window [t0, t1) sits at x = i + (t - t0) / (t1 - t0). Between
windows nothing is drawn. Without phase marks the whole trace is one column. Each column keeps at
most ``POINTS_PER_COLUMN`` points per curve (the highest of each slice), so every peak survives.
"""

from __future__ import annotations

from memfit.core.compare.phases import WHOLE_RUN, covered, tensor_gpu_bytes
from memfit.core.compare.run import RecordedRun
from memfit.core.compare.types import Series, SeriesPoint, Timeline
from memfit.core.ledger_types import Plan

POINTS_PER_COLUMN = 120


def _plan_bytes(plan: Plan, name: str, device: str = "gpu") -> int:
    names = covered(plan, name)[0]
    if device == "host":
        return max((max(p.cpu_locked_peak_bytes, p.cpu_peak_bytes) if p.allocators_simulated else p.cpu_peak_bytes
                    for p in (plan.phase(n) for n in names)), default=0)
    return max((tensor_gpu_bytes(plan.phase(n)) for n in names), default=0)


def _thin(points: list[tuple[float, int]], col: int) -> list[SeriesPoint]:
    if len(points) <= POINTS_PER_COLUMN:
        return [SeriesPoint(x=x, bytes=b) for x, b in points]
    slices: dict[int, tuple[float, int]] = {}
    for x, b in points:
        k = min(int((x - col) * POINTS_PER_COLUMN), POINTS_PER_COLUMN - 1)
        if k not in slices or b > slices[k][1]:
            slices[k] = (x, b)
    keep = [points[0], *slices.values(), points[-1]]
    return [SeriesPoint(x=x, bytes=b) for x, b in sorted(set(keep))]


def _host_timeline(plan: Plan, run: RecordedRun, cols, capacity_bytes: int | None) -> Timeline | None:
    pts = []
    for i, (name, t0, _) in enumerate(cols):
        ph = next((p for p in run.occ.get(name, []) if p.t_start_us == t0), None)
        v = ph.rss_peak_bytes if ph is not None else None
        if v is not None:
            pts += [SeriesPoint(x=float(i), bytes=v), SeriesPoint(x=float(i + 1), bytes=v)]
    if not pts:
        return None
    plan_pts = []
    for i, (name, _, _) in enumerate(cols):
        v = _plan_bytes(plan, name, "host")
        plan_pts += [SeriesPoint(x=float(i), bytes=v), SeriesPoint(x=float(i + 1), bytes=v)]
    return Timeline(phases=tuple(c[0] for c in cols),
                    plan=Series(label="plan: host memory per process", points=tuple(plan_pts), style="step"),
                    recorded=(Series(label="process RSS peak (memfit.record)", points=tuple(pts), style="step"),),
                    capacity_bytes=capacity_bytes, device="host")


def build_timeline(plan: Plan, run: RecordedRun, capacity_bytes: int | None,
                   host_capacity_bytes: int | None = None) -> Timeline | None:
    cols: list[tuple[str, int, int]] = sorted(((p.name, p.t_start_us, p.t_end_us) for ps in run.occ.values() for p in ps
                                               if p.t_start_us is not None and p.t_end_us is not None), key=lambda c: c[1])
    r = run.replay
    if not cols:
        timed = [e.time_us for e in r.events if e.time_us is not None] if r is not None else []
        if not timed:
            return None
        cols = [(WHOLE_RUN, min(timed), max(timed) + 1)]
    plan_pts = []
    for i, (name, _, _) in enumerate(cols):
        v = _plan_bytes(plan, name)
        plan_pts += [SeriesPoint(x=float(i), bytes=v), SeriesPoint(x=float(i + 1), bytes=v)]
    recorded: list[Series] = []
    if r is not None:
        live_pts: list[SeriesPoint] = []
        res_pts: list[SeriesPoint] = []
        for i, (_, t0, t1) in enumerate(cols):
            span = max(t1 - t0, 1)
            live: list[tuple[float, int]] = []
            res: list[tuple[float, int]] = []
            for k, e in enumerate(r.events):
                if e.time_us is None or not t0 <= e.time_us < t1:
                    continue
                x = i + (e.time_us - t0) / span
                live.append((x, r.live[k]))
                res.append((x, r.reserved[k]))
            live_pts += _thin(live, i)
            res_pts += _thin(res, i)
        if live_pts:
            recorded.append(Series(label="allocated, requested bytes (snapshot trace)", points=tuple(live_pts)))
            recorded.append(Series(label="reserved (snapshot trace)", points=tuple(res_pts)))
    for label, attr in (("allocated peak (memory_stats)", "device_allocated_peak_bytes"),
                        ("reserved peak (memory_stats)", "device_reserved_peak_bytes")):
        pts = []
        for i, (name, t0, _) in enumerate(cols):
            ph = next((p for p in run.occ.get(name, []) if p.t_start_us == t0), None)
            v = getattr(ph, attr) if ph is not None else None
            if v is not None:
                pts += [SeriesPoint(x=float(i), bytes=v), SeriesPoint(x=float(i + 1), bytes=v)]
        if pts:
            recorded.append(Series(label=label, points=tuple(pts), style="step"))
    off = run.stats.utc_offset_s if run.stats else None
    if run.smi and off is not None:
        pts = []
        for i, (_, t0, t1) in enumerate(cols):
            lo, hi = t0 + off * 1_000_000, t1 + off * 1_000_000
            pts += [SeriesPoint(x=i + (s.local_time_us - lo) / max(hi - lo, 1), bytes=s.used_bytes) for s in run.smi
                    if s.local_time_us is not None and lo <= s.local_time_us < hi]
        if pts:
            recorded.append(Series(label="nvidia-smi", points=tuple(pts), style="dots"))
    if not recorded:  # no GPU figure: a CPU recording; its resident set against the plan's host figure
        return _host_timeline(plan, run, cols, host_capacity_bytes)
    return Timeline(phases=tuple(c[0] for c in cols), plan=Series(label="plan: tensors on the GPU", points=tuple(plan_pts),
                                                                   style="step"),
                    recorded=tuple(recorded), capacity_bytes=capacity_bytes)
