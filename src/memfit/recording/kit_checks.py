"""Plan vs recording for the GPU validation kit's output (``tests/fixtures/cuda/``), without torch.

``check_kit(out_dir)`` reads ``summary.json`` and every case folder and returns one ``KitCheck`` per
comparison; tests/cuda/test_cuda_fixtures.py asserts on them in every CI run.

For the DeepSpeed cases the plan is the one of the scenario the case ran, rebuilt from its
``case.json`` with ``memfit.replay.compare.scenario_of`` (the model config with the layer override,
the PEFT method, the DeepSpeed JSON handed to ``deepspeed.initialize``, the world size, the card).
Checks:

- ``allocated`` in the phases whose GPU items are all exact (``initialize.*`` and the like): the
  plan's tensor bytes against the snapshot trace's requested peak, within ``EXACT_TOLERANCE_BYTES``;
- ``pinned``: the pinned allocator holds at least what the plan pins (it rounds each request up to a
  power of two and keeps freed blocks: never less), per phase; the plan's simulated page-locked
  figure is reported next to what was held;
- ``reserved``: the allocator's reserved peak is at least its allocated peak (a recording sanity
  check); the plan's simulated reserved figure (the allocator simulator run on the ledger's tensors,
  an estimate) is reported next to the recorded one;
- ``simulator``: the snapshot's alloc/free sequence replayed by the CUDA caching allocator simulator
  (when this memfit has one) reproduces every recorded segment event.

Estimated items (activations, gathered params) are reported with their difference, not asserted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

EXACT_TOLERANCE_BYTES = 64 * 1024
"""Small tensors torch and DeepSpeed create that the ledger does not list (loss scale, step counters,
RNG state). A guess until the first GPU recording: tighten to ~2x the worst difference it shows."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KitCheck:
    case: str
    what: str
    planned_bytes: int | None
    recorded_bytes: int | None
    ok: bool
    asserted: bool
    """False for figures reported only (estimates)."""
    detail: str = ""


def scenario_for_case(case_dir: Path):
    """The scenario a DeepSpeed case ran (pure: no torch)."""
    from memfit.replay.compare import scenario_of
    from memfit.replay.measurement import DeviceInfo, Measurement
    from memfit.replay.spec import ReplaySpec

    info = json.loads((case_dir / "case.json").read_text())
    spec = ReplaySpec.from_dict(info["spec"])
    device = None
    if info.get("device") == "cuda":
        device = DeviceInfo(accelerator="cuda", name=info.get("device_name", "cuda"),
                            total_bytes=int(info.get("device_total_bytes") or 0),
                            capacity_bytes=spec.emulate_capacity_bytes)
    m = Measurement(spec=spec, deepspeed_config_used=info["deepspeed_config_used"],
                    substitutions=tuple(info.get("substitutions", ())), device=device, versions={}, command="gpu kit")
    return scenario_of(m)


def _deepspeed_checks(name: str, case_dir: Path) -> list[KitCheck]:
    from memfit.core.compare import reconcile
    from memfit.core.compare.phases import covered, peak_phase, tensor_gpu_exact
    from memfit.core.plan import make_plan
    from memfit.core.records import read_records

    sc = scenario_for_case(case_dir)
    plan = make_plan(sc)
    rc = reconcile(plan, read_records([case_dir]), capacity_bytes=sc.hardware.gpu.total_bytes)
    out: list[KitCheck] = []
    for row in rc.rows:
        if row.phase == "whole run" or not row.occurrences:
            continue
        trace = next((f for f in row.allocated.recorded if f.source == "snapshot trace"), None)
        pph = peak_phase(plan, covered(plan, row.phase)[0])
        if trace is not None and row.allocated.planned is not None and pph is not None:
            exact = tensor_gpu_exact(pph)
            diff = row.allocated.planned.bytes - trace.bytes
            out.append(KitCheck(case=name, what=f"{row.phase}: allocated", planned_bytes=row.allocated.planned.bytes,
                                recorded_bytes=trace.bytes, ok=abs(diff) <= EXACT_TOLERANCE_BYTES, asserted=exact,
                                detail=f"plan - recorded = {diff:+,} B" + ("" if exact else " (plan estimate: reported only)")))
        held = next((f for f in row.pinned.recorded if f.source == "host_memory_stats"), None)
        requested = max((plan.phase(n).cpu_pinned_bytes for n in row.plan_phases), default=0)
        if held is not None and requested:
            out.append(KitCheck(case=name, what=f"{row.phase}: pinned held >= planned", planned_bytes=requested,
                                recorded_bytes=held.bytes, ok=held.bytes >= requested, asserted=True,
                                detail=f"held / requested = {held.bytes / requested:.3f}"))
            if row.pinned.planned is not None and row.pinned.planned.bytes != requested:
                diff = row.pinned.planned.bytes - held.bytes
                out.append(KitCheck(case=name, what=f"{row.phase}: pinned locked (simulated)", planned_bytes=row.pinned.planned.bytes,
                                    recorded_bytes=held.bytes, ok=diff == 0, asserted=False,
                                    detail=f"simulated locked - held = {diff:+,} B (reported)"))
        if row.reserved.planned is not None:
            rec = next((f for f in row.reserved.recorded if f.source == "snapshot trace"), None) or \
                next((f for f in row.reserved.recorded if f.source == "memory_stats"), None)
            if rec is not None:
                out.append(KitCheck(case=name, what=f"{row.phase}: reserved (simulated on the ledger)",
                                    planned_bytes=row.reserved.planned.bytes, recorded_bytes=rec.bytes,
                                    ok=row.reserved.planned.bytes == rec.bytes, asserted=False,
                                    detail=f"plan - recorded = {row.reserved.planned.bytes - rec.bytes:+,} B (reported)"))
        res = next((f for f in row.reserved.recorded if f.source == "memory_stats"), None)
        alloc = next((f for f in row.allocated.recorded if f.note.startswith("allocated_bytes")), None)
        if res is not None and alloc is not None:
            out.append(KitCheck(case=name, what=f"{row.phase}: reserved >= allocated", planned_bytes=None,
                                recorded_bytes=res.bytes, ok=res.bytes >= alloc.bytes, asserted=True,
                                detail=f"reserved - allocated = {res.bytes - alloc.bytes:+,} B"))
    if rc.simulator is not None:
        out.append(_simulator_check(name, rc.simulator))
    return out


def _simulator_check(name: str, s) -> KitCheck:
    checked = s.status == "checked"
    return KitCheck(case=name, what="allocator simulator", planned_bytes=s.simulated_reserved_peak_bytes,
                    recorded_bytes=s.recorded_reserved_peak_bytes, ok=(not checked) or not s.divergences,
                    asserted=checked, detail=f"{s.status}: {len(s.divergences)} divergence(s); {s.reason}".strip("; "))


def check_kit(out_dir: Path) -> list[KitCheck]:
    from memfit.core.compare.simcheck import check_snapshot
    from memfit.core.records import read_records

    summary = json.loads((out_dir / "summary.json").read_text())
    out: list[KitCheck] = []
    for row in summary["cases"]:
        name, case_dir = row["case"], out_dir / row["case"]
        if row["status"] != "ok":
            out.append(KitCheck(case=name, what="ran", planned_bytes=None, recorded_bytes=None, ok=row["status"] == "skipped",
                                asserted=False, detail=f"{row['status']}: {row.get('error') or row.get('note', '')}"))
            continue
        info = json.loads((case_dir / "case.json").read_text())
        if info["kind"] == "deepspeed":
            out.extend(_deepspeed_checks(name, case_dir))
        elif info["kind"] == "alloc_device":
            records = read_records([case_dir])
            if records.snapshots:
                out.append(_simulator_check(name, check_snapshot(records.snapshots[0], rank=0, device=0)))
    return out
