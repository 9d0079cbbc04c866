"""``make_plan``: a scenario in, the whole typed answer out (ledger, verdict, findings)."""

from __future__ import annotations

from memfit.core.findings import derive_findings
from memfit.core.ledger.build import build_ledger
from memfit.core.ledger_types import ParamCounts, Plan, TracedStep
from memfit.core.scenario import Scenario
from memfit.core.verdict import judge


def count_params(sc: Scenario) -> ParamCounts:
    m = sc.model
    big = m.largest_param
    return ParamCounts(total=m.total_params, trainable=m.trainable_params, frozen=m.frozen_params,
                       largest=big.numel, largest_name=big.name)


def make_plan(sc: Scenario, traced: TracedStep | None = None) -> Plan:
    """The plan; with ``traced`` (from ``memfit.trace.ledger_step``) the forward/backward phases use
    the traced step memory instead of the analytic estimate."""
    phases = build_ledger(sc, traced)
    verdict = judge(phases, sc.hardware)
    notes = (
        traced.note if traced is not None else
        "Activations are analytic (Korthikanti-style, corrected for frozen weights and PEFT); "
        "`memfit plan --exact` traces them from the model's code.",
        f"Allocation behaviour of DeepSpeed {sc.ds_version}.x; GPU bytes are what tensors hold (the caching "
        "allocator may reserve more).",
    )
    return Plan(scenario_name=sc.name, params=count_params(sc), phases=phases, verdict=verdict,
                findings=derive_findings(sc, phases, verdict), notes=notes)
