"""A published, measured run (``core/records/public_run.py``) against memfit's plan of it.

``compare_public_run(case)`` plans the case's inline scenario (its relative paths resolve against
the case's folder) with the case's own ``stack:`` (``case_stack``: the releases the run used, so the
plan follows their defaults and allocations) and compares every measurement like for like: the plan figure of the same kind
(``KIND_FIGURE``), as its highest value over the phases the measurement's window spans. The error
is ``(planned - measured) / measured``: negative where memfit says less than the run used. A
``bound: lower`` measurement (the run needed at least this much) only counts memfit's shortfall.

The verdict is compared with the run's outcome: ``fits`` agrees with memfit's "fits"; an OOM with
"does not fit" on the device the run ran out of (``oom-unknown``: any device). "At risk" is no way
out: it agrees only where a measured GPU figure of the run (reserved or nvidia-smi, the ones an OOM
depends on) shows it within memfit's margin of the card, or the case is the largest batch (or
context) that trained (``outcome_evidence``), or the run died; a run that fitted far from its limit
makes "at risk" wrong.
"""

from __future__ import annotations

import re
from pathlib import Path

from memfit.core.lean_dataclass import dataclass
from memfit.core.records.public_run import Measurement, PublicRun, window_phases
from memfit.errors import MemfitError

OOM_DEVICE = {"oom-gpu": ("gpu",), "oom-host": ("cpu",), "oom-pinned": ("cpu",), "oom-unknown": ("gpu", "cpu", "nvme")}
NEAR_LIMIT_KINDS = ("reserved", "peak_reserved", "nvidia_smi")
NEAR_RAM_KINDS = ("host_used_machine",)
"""Measured host figures of the whole node, compared with its RAM as the GPU ones are with the card."""
AT_THE_LIMIT = re.compile(r"\blargest\b|\bmax\b|maximum", re.IGNORECASE)
"""A verdict-only case whose outcome is the largest batch (or context) that trained: the next one
up ran out of memory, so the run was at its limit by construction."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FigureComparison:
    measurement: Measurement
    phases: tuple[str, ...]
    """The plan's phases the window spans."""
    planned_bytes: int | None
    """None: no plan figure of this kind (``failed_request``) or the window names no planned phase."""
    peak_phase: str = ""

    @property
    def error(self) -> float | None:
        """(planned - measured) / measured; for a lower bound only a shortfall counts (else 0)."""
        if self.planned_bytes is None:
            return None
        e = (self.planned_bytes - self.measurement.bytes) / self.measurement.bytes
        return min(e, 0.0) if self.measurement.bound == "lower" else e


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseComparison:
    case: PublicRun
    framework: str
    """The planned framework (deepspeed, torch, ddp, fsdp, fsdp2)."""
    figures: tuple[FigureComparison, ...]
    level: str
    """memfit's verdict: ``fits``, ``at_risk``, ``does_not_fit``."""
    failed_devices: tuple[str, ...]
    agrees: bool
    why: str
    """Why the verdict agrees or not, in words."""
    gpu_ratio: float
    """The verdict's GPU figure over the card, at its worst phase."""
    error: str = ""
    """Why the case could not be planned (memfit's one-line refusal); then nothing else is set."""
    stack_notes: tuple[str, ...] = ()
    """How the case's published stack became the plan's (``case_stack``)."""


ALIASES = {"deepspeed": ((), "deepspeed_version"), "torch": (("runtime",), "torch_version"),
           "cuda": (("runtime",), "cuda_version"), "transformers": (("runtime",), "transformers_version"),
           "bitsandbytes": (("runtime",), "bitsandbytes_version")}
"""The scenario keys that give a library's version under their older names (``scenario/read.py``)."""

_VERSION_TOKEN = re.compile(r"v?\d+\.\d+(?:\.\d+)?[.\-+_a-zA-Z0-9]*")


def case_stack(case: PublicRun) -> tuple[dict, tuple[str, ...]]:
    """The case's scenario mapping with the case's own ``stack:`` in it, and what was done, in words.

    A version of the case's stack goes into the scenario's ``stack:`` (so the plan follows that
    release's defaults and allocations: ``core/stack/``) unless the scenario's ``stack:`` names that
    library itself (the scenario wins). The case's text is read as its first version number
    (``4.25/4.26`` -> 4.25, ``1.12.0.dev (nightly)`` -> 1.12.0.dev, said). A scenario key that gave
    the version under an older name (``deepspeed_version``, ``runtime.torch_version``) is replaced
    by the stack's version, said where it named another release line. A version memfit does not
    model (torch 1.7.1) leaves the scenario as it is, said with the release planned instead."""
    from memfit.core.stack.releases import library, release_line

    mapping = {k: (dict(v) if isinstance(v, dict) else v) for k, v in case.scenario.items()}
    own = dict(mapping.get("stack") or {})
    notes: list[str] = []
    for lib, text in case.stack:
        label = library(lib).label
        if lib in own:
            continue
        m = _VERSION_TOKEN.search(text)
        if m is None:
            notes.append(f"{label} {text!r} (the case's stack) holds no version number; not passed to the plan")
            continue
        version = m.group(0)
        if version != text:
            notes.append(f"{label} {text!r} (the case's stack) read as {version}")
        path, key = ALIASES.get(lib, ((), ""))
        holder = mapping.get(path[0]) if path else mapping
        alias = holder.get(key) if key and isinstance(holder, dict) else None
        try:
            line = release_line(lib, version, where=f"the case's stack.{lib}")
        except MemfitError:
            planned = f"; the scenario's {'.'.join((*path, key))} {alias} is planned" if alias is not None else \
                f"; memfit's default {label} is planned"
            notes.append(f"{label} {version} (the case's stack) is not a release memfit models{planned}")
            continue
        if alias is not None:
            was = release_line(lib, str(alias), where=f"the case's scenario {'.'.join((*path, key))}")
            del holder[key]
            if was != line:
                notes.append(f"{label} {version} (the case's stack) planned, not the scenario's "
                             f"{'.'.join((*path, key))} {alias}")
        own[lib] = version
    if own:
        mapping["stack"] = own
    return mapping, tuple(notes)


def plan_case(case: PublicRun):  # -> tuple[Scenario, Plan]
    """The case planned with its own stack (``case_stack``)."""
    from memfit.core.plan import make_plan
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.read import read_scenario_mapping

    mapping, _ = case_stack(case)
    sc = build_scenario(read_scenario_mapping(mapping, case.path.with_name(f"{case.id}.scenario.yaml")))
    return sc, make_plan(sc)


def compare_public_run(case: PublicRun) -> CaseComparison:
    from dataclasses import replace

    try:
        _, notes = case_stack(case)
        sc, plan = plan_case(case)
    except MemfitError as exc:
        return CaseComparison(case=case, framework=str(case.scenario.get("framework", "")), figures=(),
                              level="", failed_devices=(), agrees=False, why="not planned", gpu_ratio=0.0,
                              error=str(exc))
    return replace(compare_plan(case, sc, plan), stack_notes=notes)


def compare_plan(case: PublicRun, sc, plan) -> CaseComparison:  # noqa: ANN001
    from memfit.core.verdict import gpu_figure

    names = tuple(p.name for p in plan.phases)
    figs = []
    for m in case.measurements:
        phases = window_phases(m.window, names)
        if not m.figure or not phases:
            figs.append(FigureComparison(measurement=m, phases=phases, planned_bytes=None))
            continue
        best = max((plan.phase(n) for n in phases), key=lambda ph: getattr(ph, m.figure))
        figs.append(FigureComparison(measurement=m, phases=phases, planned_bytes=getattr(best, m.figure),
                                     peak_phase=best.name))
    v = plan.verdict
    level = v.level
    failed = tuple(dict.fromkeys(f.device for f in v.failures))
    cap = sc.hardware.gpu.total_bytes
    ratio = max(gpu_figure(p) for p in plan.phases) / cap
    agrees, why = _agreement(case, level, failed, figs, cap, v, ram=sc.hardware.cpu_ram_bytes)
    return CaseComparison(case=case, framework=sc.framework, figures=tuple(figs), level=level, failed_devices=failed,
                          agrees=agrees, why=why, gpu_ratio=ratio)


def _agreement(case: PublicRun, level: str, failed: tuple[str, ...], figs, cap: int, v,  # noqa: ANN001
               ram: int = 0) -> tuple[bool, str]:
    if case.outcome == "fits":
        if level == "fits":
            return True, "fits, as the run did"
        if level == "does_not_fit":
            return False, f"memfit says it does not fit ({', '.join(failed)}); the run fitted"
        host_near = [f.measurement.bytes / ram for f in figs if ram and f.measurement.kind in NEAR_RAM_KINDS]
        host_limit = 1 / (1 + v.host_margin) if v.host_margin else 1.0
        if any(r.device == "cpu" for r in v.risks) and host_near and max(host_near) >= host_limit:
            return True, (f"at risk; the run used {max(host_near):.0%} of the node's RAM (within memfit's host "
                          f"margin: >= {host_limit:.0%})")
        near = [f.measurement.bytes / cap for f in figs if f.measurement.kind in NEAR_LIMIT_KINDS]
        limit = 1 / (1 + v.gpu_margin) if v.gpu_margin else 1.0
        if near and max(near) >= limit:
            return True, (f"at risk; the run fitted at {max(near):.0%} of the card (within memfit's margin: "
                          f">= {limit:.0%})")
        if not near and AT_THE_LIMIT.search(case.outcome_evidence):
            return True, f"at risk; the run was at its limit ({case.outcome_evidence[:80]})"
        return False, ("at risk, but the run fitted " + (f"at {max(near):.0%} of the card" if near else
                                                          "(nothing shows it near its limit)"))
    devices = OOM_DEVICE[case.outcome]
    if level == "does_not_fit" and any(d in devices for d in failed):
        return True, f"does not fit ({', '.join(failed)}), as the run ran out of memory"
    if level == "does_not_fit":
        return False, f"does not fit on {', '.join(failed)}, but the run ran out of {case.outcome[4:]} memory"
    if level == "at_risk":
        return True, "at risk; the run ran out of memory"
    return False, "memfit says it fits; the run ran out of memory"


def corpus_folder() -> Path:
    """The corpus shipped with the tests (a source checkout)."""
    return Path(__file__).resolve().parents[4] / "tests" / "fixtures" / "public_runs"
