"""``reconcile(plan, records)``: the plan, phase by phase, against what a real run recorded.

For each phase: the plan's allocated / reserved / pinned / nvidia-smi figures next to every record
that provides one (``types.Cell``: the first recorded figure is the one compared). Recorded phases
come from the stats file's marks (memfit.record) and from DeepSpeed's reports; the snapshot's trace
and the nvidia-smi samples are cut into phases by the stats file's timestamps (both Unix time; the
samples' local time is shifted by the recording's UTC offset). A final ``whole run`` row compares the
peaks of the whole recording with the plan's, so records without phases still count.

The snapshot's allocations are attributed to ledger items by their stack frames (``frames``) at each
phase's peak (``attribution``), with the allocations the plan does not have and the planned items the
trace never shows.
"""

from __future__ import annotations

from memfit.core.compare.frames import FrameReader
from memfit.core.compare.phases import (
    WHOLE_RUN,
    covered,
    order_key,
    outside_allocator,
    peak_phase,
    tensor_gpu_bytes,
    tensor_gpu_exact,
)
from memfit.core.compare.run import RecordedRun
from memfit.core.compare.simcheck import check_snapshot
from memfit.core.compare.timeline import build_timeline
from memfit.core.compare.trace import BEFORE, UNKNOWN, KeyedReplay
from memfit.core.compare.types import (
    Attribution,
    Cell,
    Figure,
    KeyRow,
    MissingItem,
    PhaseAttribution,
    PhaseRow,
    Reconciliation,
    RecordSummary,
    UnplannedAllocation,
)
from memfit.core.ledger_types import Device, Plan
from memfit.core.records.types import MemorySnapshot, RecordSet
from memfit.errors import MemfitError


def _fig(value: int | None, source: str, *, tol: int = 0, note: str = "") -> Figure | None:
    return None if value is None else Figure(bytes=value, source=source, tolerance_bytes=tol, note=note)


def _maxfig(figs: list[Figure | None]) -> Figure | None:
    real = [f for f in figs if f is not None]
    return max(real, key=lambda f: f.bytes) if real else None


def _recorded(run: RecordedRun, name: str) -> dict[str, list[Figure]]:
    out: dict[str, list[Figure]] = {q: [] for q in ("allocated", "reserved", "pinned", "nvidia_smi", "host")}
    whole = name == WHOLE_RUN
    occ = [p for ps in run.occ.values() for p in ps] if whole else run.occ.get(name, [])
    windows = [w for ws in run.windows.values() for w in ws] if whole else run.windows.get(name, [])
    # snapshot trace (exact requested bytes and segments)
    if run.replay is not None:
        if whole:
            r = run.replay
            live = max([r.live_start, *r.live])
            res = max([r.reserved_start, *r.reserved])
            out["allocated"].append(Figure(bytes=live, source="snapshot trace", note="requested bytes"))
            out["reserved"].append(Figure(bytes=res, source="snapshot trace"))
        elif windows:
            peaks = [run.trace_window(t0, t1) for t0, t1 in windows]
            peaks = [p for p in peaks if p is not None]
            if peaks:
                out["allocated"].append(Figure(bytes=max(p[0] for p in peaks), source="snapshot trace", note="requested bytes"))
                out["reserved"].append(Figure(bytes=max(p[1] for p in peaks), source="snapshot trace"))
    # memory_stats / host_memory_stats / mem_get_info (memfit.record: peaks reset at each phase start)
    def most(attr: str) -> int | None:
        vals = [getattr(p, attr) for p in occ if getattr(p, attr) is not None]
        return max(vals) if vals else None

    for q, attr, note in (("allocated", "device_requested_peak_bytes", "requested_bytes"),
                          ("allocated", "device_allocated_peak_bytes", "allocated_bytes (blocks, 512 B rounding)"),
                          ("reserved", "device_reserved_peak_bytes", ""),
                          ("pinned", "pinned_held_peak_bytes", "held blocks (rounded up to powers of two)")):
        f = _fig(most(attr), "memory_stats" if q != "pinned" else "host_memory_stats", note=note)
        if f is not None:
            out[q].append(f)
    # nvidia-smi samples within the phase, then mem_get_info at the phase end
    if run.smi:
        if whole:
            out["nvidia_smi"].append(Figure(bytes=max(s.used_bytes for s in run.smi), source="nvidia-smi",
                                            tolerance_bytes=2**19, note=f"max of {len(run.smi)} samples (MiB)"))
        else:
            hits = [h for h in (run.smi_window(t0, t1) for t0, t1 in windows) if h is not None]
            if hits:
                out["nvidia_smi"].append(Figure(bytes=max(h[0] for h in hits), source="nvidia-smi", tolerance_bytes=2**19,
                                                note=f"max of {sum(h[1] for h in hits)} samples (MiB)"))
    f = _fig(most("driver_used_end_bytes"), "mem_get_info", note="at the phase end, whole card")
    if f is not None:
        out["nvidia_smi"].append(f)
    # the process's resident set (memfit.record measures it on every device; on CPU it is all there is)
    f = _fig(most("rss_peak_bytes"), "process RSS", note="peak resident set of the process (memfit.record)")
    if f is not None:
        out["host"].append(f)
    # DeepSpeed see_memory_usage (rounded; peaks since the previous report)
    lines = [ln for ln in run.ds if (whole or ln.phase == name)]
    if lines:
        top = max(lines, key=lambda ln: ln.peak_allocated_bytes)
        out["allocated"].append(Figure(bytes=top.peak_allocated_bytes, source="deepspeed log",
                                       tolerance_bytes=top.precision_bytes, note=f"Max_MA, {len(lines)} report(s)"))
        topr = max(lines, key=lambda ln: ln.peak_reserved_bytes)
        out["reserved"].append(Figure(bytes=topr.peak_reserved_bytes, source="deepspeed log",
                                      tolerance_bytes=topr.peak_reserved_precision_bytes, note="Max_CA (whole GiB)"))
    return out


def _planned(plan: Plan, names: tuple[str, ...]) -> dict[str, Figure | None]:
    phases = [plan.phase(n) for n in names]
    if not phases:
        return {"allocated": None, "reserved": None, "pinned": None, "nvidia_smi": None, "host": None}
    top = max(phases, key=tensor_gpu_bytes)
    simulated = all(getattr(p, "allocators_simulated", False) for p in phases)
    out: dict[str, Figure | None] = {
        "allocated": Figure(bytes=tensor_gpu_bytes(top), source="plan" if tensor_gpu_exact(top) else "plan estimate",
                            note=f"tensors at {top.name}'s GPU peak (requested bytes)"),
    }
    if simulated:
        res = max(phases, key=lambda p: p.gpu_reserved_bytes)
        pin = max(phases, key=lambda p: p.cpu_pinned_locked_bytes)
        smi = max(phases, key=lambda p: p.gpu_nvidia_smi_bytes)
        out["reserved"] = Figure(bytes=res.gpu_reserved_bytes, source="plan estimate",
                                 note="the CUDA allocator simulator on the ledger's tensors")
        out["pinned"] = Figure(bytes=pin.cpu_pinned_locked_bytes, source="plan",
                               note="page-locked: the pinned allocator simulator (rounded blocks, cached frees)")
        out["nvidia_smi"] = Figure(bytes=smi.gpu_nvidia_smi_bytes, source="plan estimate",
                                   note="simulated reserved + memory outside PyTorch (estimate)")
        host = max(phases, key=lambda p: p.cpu_locked_peak_bytes)
        out["host"] = Figure(bytes=host.cpu_locked_peak_bytes, source="plan" if _host_exact(host) else "plan estimate",
                             note=f"per process, pageable + page-locked, at {host.name}'s host peak")
    else:
        host = max(phases, key=lambda p: p.cpu_peak_bytes)
        out["host"] = Figure(bytes=host.cpu_peak_bytes, source="plan" if _host_exact(host) else "plan estimate",
                             note=f"per process, pageable + pinned, at {host.name}'s host peak")
        pin = max(phases, key=lambda p: p.cpu_pinned_bytes)
        gpu = max(phases, key=lambda p: p.gpu_peak_bytes)
        out["reserved"] = None
        out["pinned"] = Figure(bytes=pin.cpu_pinned_bytes, source="plan", note=f"requested, at {pin.name}'s host peak")
        out["nvidia_smi"] = Figure(bytes=gpu.gpu_peak_bytes, source="plan estimate",
                                   note="tensors + the CUDA context estimate")
    return out


def _host_exact(ph) -> bool:
    return all(i.exact for i in ph.items if i.device in (Device.CPU_PINNED, Device.CPU_PAGEABLE))


def _rows(plan: Plan, run: RecordedRun) -> list[PhaseRow]:
    names: list[str] = []
    seen: dict[str, int] = {}
    for n in [*run.occ, *(ln.phase for ln in run.ds if ln.phase)]:
        if n not in seen:
            seen[n] = len(seen)
            names.append(n)
    covered_plan: set[str] = set()
    for n in names:
        covered_plan.update(covered(plan, n)[0])
    names += [p.name for p in plan.phases if p.name not in covered_plan and p.name not in seen]
    names.sort(key=lambda n: order_key(n, seen))
    rows = []
    for n in [*names, WHOLE_RUN]:
        plan_names, note = covered(plan, n)
        planned = _planned(plan, plan_names)
        rec = _recorded(run, n) if (n in seen or n == WHOLE_RUN) else {q: [] for q in planned}
        cells = {q: Cell(planned=planned[q], recorded=tuple(rec[q])) for q in planned}
        rows.append(PhaseRow(phase=n, plan_phases=plan_names, occurrences=len(run.occ.get(n, [])), note=note, **cells))
    return rows


def _key_name(keys: tuple[str, ...], inplan: list, gpu_items: dict) -> str:
    if inplan:
        return " + ".join(i.name for i in inplan)
    if keys[0] in gpu_items:
        return f"{gpu_items[keys[0]][0].name} (planned in other phases)"
    return f"{', '.join(keys)} (a memfit rule; not in the plan)"


def _blocks_attribution(plan: Plan, run: RecordedRun) -> Attribution | None:
    """No trace (history off, or ``enabled="state"``): the blocks live at the dump, by their frames,
    against what the plan keeps at the end of the last recorded phase (its resident items)."""
    snap = run.snapshot
    blocks = [b for seg in snap.segments for b in seg.blocks if b.live] if snap is not None else []
    if not blocks:
        return None
    reader = FrameReader(plan)
    totals: dict[tuple[str, ...], int] = {}
    for b in blocks:
        keys = reader.keys_for(b.frames) or ()
        totals[keys] = totals.get(keys, 0) + b.requested_size
    recorded = [n for n in run.occ if covered(plan, n)[0]]
    plan_phase = plan.phase(covered(plan, recorded[-1])[0][-1]) if recorded else plan.phases[-1]
    planned = {i.key: i for i in plan_phase.resident if i.device is Device.GPU and not outside_allocator(i)}
    rows, used = [], set()
    for keys, b in sorted(totals.items(), key=lambda kv: -kv[1]):
        if not keys:
            continue
        inplan = [planned[k] for k in keys if k in planned]
        used.update(keys)
        rows.append(KeyRow(keys=keys, name=" + ".join(i.name for i in inplan) or f"{', '.join(keys)} (not resident in the plan)",
                           planned_bytes=sum(i.bytes for i in inplan) if inplan else None, recorded_bytes=b,
                           exact=all(i.exact for i in inplan)))
    rows += [KeyRow(keys=(k,), name=i.name, planned_bytes=i.bytes, recorded_bytes=0, exact=i.exact)
             for k, i in planned.items() if k not in used and i.bytes]
    phase = PhaseAttribution(phase="at the snapshot", plan_phase=f"{plan_phase.name} (resident at its end)",
                             peak_bytes=sum(totals.values()), peak_time_us=None, rows=tuple(rows),
                             unattributed_bytes=totals.get((), 0))
    return Attribution(rank=run.rank, trace_events=0, phases=(phase,), unplanned=(), missing=(), rules=reader.describe(),
                       notes=("no trace in the snapshot: the blocks live when it was taken, by their frames",))


def _attribution(plan: Plan, run: RecordedRun) -> Attribution | None:
    r = run.replay
    if r is None:
        return _blocks_attribution(plan, run)
    reader = FrameReader(plan)
    keyed = KeyedReplay(r, reader)
    gpu_items = {}
    not_visible = []
    for ph in plan.phases:
        for it in ph.items:
            if it.device is not Device.GPU:
                continue
            if outside_allocator(it):
                entry = f"{it.name} ({it.key}): {it.bytes:,} B, estimate"
                if entry not in not_visible:
                    not_visible.append(entry)
                continue
            gpu_items.setdefault(it.key, (it, []))[1].append(ph.name)
    # the peak of each recorded phase (its highest occurrence), or of the whole trace
    targets: list[tuple[str, int, int]] = []
    for name, ws in run.windows.items():
        best = None
        for t0, t1 in ws:
            hit = run.trace_window(t0, t1)
            if hit is not None and (best is None or hit[0] > best[0]):
                best = (hit[0], hit[2])
        if best is not None:
            targets.append((name, best[0], best[1]))
    if not targets:
        peak = max(range(-1, len(r.live)), key=lambda k: r.live[k] if k >= 0 else r.live_start)
        targets.append((WHOLE_RUN, r.live[peak] if peak >= 0 else r.live_start, peak))
    by_stop, sites = keyed.run({t[2] for t in targets})
    phases = []
    for name, peak, stop in targets:
        plan_names, _ = covered(plan, name)
        pph = peak_phase(plan, plan_names)
        planned = {i.key: i for i in (pph.items if pph else ()) if i.device is Device.GPU
                   and not outside_allocator(i)}
        totals = by_stop.get(stop, {})
        rows = []
        used: set[str] = set()
        for keys, b in sorted(totals.items(), key=lambda kv: -kv[1]):
            if keys in (BEFORE, UNKNOWN):
                continue
            inplan = [planned[k] for k in keys if k in planned]
            used.update(keys)
            rows.append(KeyRow(keys=keys, name=_key_name(keys, inplan, gpu_items),
                               planned_bytes=sum(i.bytes for i in inplan) if inplan else None, recorded_bytes=b,
                               exact=all(i.exact for i in inplan)))
        for key, it in planned.items():
            if key not in used and it.bytes:
                rows.append(KeyRow(keys=(key,), name=it.name, planned_bytes=it.bytes, recorded_bytes=0, exact=it.exact))
        if not rows and not peak:
            continue  # nothing on the GPU, planned or recorded
        phases.append(PhaseAttribution(phase=name, plan_phase=pph.name if pph else None, peak_bytes=peak,
                                       peak_time_us=r.events[stop].time_us if stop >= 0 else None, rows=tuple(rows),
                                       unattributed_bytes=totals.get(UNKNOWN, 0), before_trace_bytes=totals.get(BEFORE, 0)))
    # allocations the plan does not have; planned items the trace never shows
    unplanned = []
    seen_keys: set[str] = set()
    for site, s in sites.items():
        keys = tuple(s["keys"] or ())
        seen_keys.update(keys)
        if keys and any(k in gpu_items for k in keys):
            continue
        in_phases = sorted({n for n, ws in run.windows.items() for k in s["allocs"] for t0, t1 in ws
                            if r.events[k].time_us is not None and t0 <= r.events[k].time_us < t1},
                           key=lambda n: order_key(n, {}))
        unplanned.append(UnplannedAllocation(where=site, keys=keys, peak_live_bytes=s["peak"], count=s["count"],
                                             stack=tuple(f.short() for f in s["frames"][:5]), phases=tuple(in_phases)))
    unplanned.sort(key=lambda u: -u.peak_live_bytes)
    recorded_plan = {p for n in run.windows for p in covered(plan, n)[0]}
    missing = []
    for key, (it, phase_names) in gpu_items.items():
        if key in seen_keys or not it.bytes:
            continue
        if run.windows and not recorded_plan.intersection(phase_names):
            reason = "its phases were not recorded"
        elif r.live_start:
            reason = "not in the trace (which began after the run did)"
        else:
            reason = "never allocated in the recorded trace"
        missing.append(MissingItem(key=key, name=it.name, planned_bytes=max(i.bytes for ph in plan.phases for i in ph.items
                                                                               if i.key == key and i.device is Device.GPU),
                                   phases=tuple(phase_names), reason=reason))
    return Attribution(rank=run.rank, trace_events=len(r.events), phases=tuple(phases), unplanned=tuple(unplanned),
                       missing=tuple(missing), not_visible=tuple(not_visible), rules=reader.describe(),
                       notes=tuple(r.notes))


def _summaries(records: RecordSet) -> list[RecordSummary]:
    out = []
    for s in records.snapshots:
        events = sum(len(t.events) for t in s.traces)
        provides = ("allocated (requested bytes, exact)", "reserved", "attribution by stack frames") if events else \
            ("segments at the dump",)
        out.append(RecordSummary(path=s.path, kind="memory snapshot", provides=provides,
                                 detail=f"rank {s.rank if s.rank is not None else 0}, {len(s.segments)} segments, "
                                        f"{events:,} trace events"))
    for st in records.stats:
        provides = ("allocated", "reserved", "pinned", "nvidia-smi (mem_get_info)", "host RAM (process RSS)") \
            if st.device == "cuda" else ("host RAM (process RSS) only: torch keeps no CPU allocator statistics",)
        out.append(RecordSummary(path=st.path, kind="memory_stats per phase", provides=provides,
                                 detail=f"rank {st.rank if st.rank is not None else 0}, {st.device}, {len(st.phases)} phases"
                                        + (f", recorder overhead {st.overhead_s:.3f} s" if st.overhead_s is not None else "")))
    for log in records.ds_logs:
        placed = sum(1 for ln in log.lines if ln.phase)
        out.append(RecordSummary(path=log.path, kind="DeepSpeed see_memory_usage", provides=("allocated", "reserved"),
                                 detail=f"{len(log.lines)} reports ({placed} closing a phase); GiB with 2 decimals, Max_CA whole GiB"))
    for smi in records.smi:
        out.append(RecordSummary(path=smi.path, kind="nvidia-smi samples", provides=("nvidia-smi",),
                                 detail=f"{len(smi.samples)} samples, GPUs {list(smi.gpus())}, MiB"))
    return out


def reconcile(plan: Plan, records: RecordSet, *, rank: int | None = None, capacity_bytes: int | None = None,
              host_capacity_bytes: int | None = None) -> Reconciliation:
    """``capacity_bytes``: the GPU's, ``host_capacity_bytes``: the host RAM per process (node RAM over
    its ranks), for the timeline's capacity line."""
    ranks = records.ranks()
    if rank is None:
        rank = ranks[0]
    elif (records.stats or records.snapshots) and rank not in ranks:
        raise MemfitError(f"--rank {rank}: the records hold ranks {', '.join(map(str, ranks))}")
    run = RecordedRun(plan, records, rank)
    rows = _rows(plan, run)
    attribution = _attribution(plan, run)
    simulator = (check_snapshot(run.snapshot, rank=rank, device=run.device,
                                torch_version=run.stats.torch_version if run.stats else None)
                 if run.snapshot is not None else None)
    timeline = build_timeline(plan, run, capacity_bytes, host_capacity_bytes)
    ds_reports = tuple((ln.message, ln.phase, ln.allocated_bytes, ln.peak_allocated_bytes) for ln in run.ds)
    notes = [*records.notes, *run.notes]
    if not any(r.cell(q).recorded for r in rows for q in ("allocated", "reserved", "pinned", "nvidia_smi")):
        notes.append("no record gave a GPU or pinned figure (a CPU recording holds only the process RSS)")
    return Reconciliation(scenario_name=plan.scenario_name, rank=rank, ranks=ranks, rows=tuple(rows),
                          records=tuple(_summaries(records)), attribution=attribution, simulator=simulator,
                          timeline=timeline, ds_reports=ds_reports, notes=tuple(dict.fromkeys(notes)))


__all__ = ["reconcile", "MemorySnapshot"]
