"""``memfit compare CASE.yaml``: a published run's measurements against memfit's plan of it, in the
terminal and as JSON (renders ``core/compare/public_run.CaseComparison``; recomputes nothing)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from memfit.core.compare.public_run import CaseComparison

GiB = 2**30
_LEVEL = {"fits": "fits", "at_risk": "at risk", "does_not_fit": "does not fit"}


def render_case(c: CaseComparison, console: Console) -> None:
    case = c.case
    console.print(Text(f"memfit compare: published run {case.id}", style="bold"))
    console.print(Text(f"source: {case.url}", style="dim"))
    if c.error:
        console.print(Text(f"memfit cannot plan this case: {c.error}", style="bold red"))
        return
    t = Table(title="measured (as published) vs planned, like for like (GiB = 2^30 B; error = planned / measured - 1)",
              title_justify="left")
    for col in ("measurement", "window", "measured", "planned", "error", "plan's peak phase"):
        t.add_column(col, justify="right" if col in ("measured", "planned", "error") else "left")
    for f in c.figures:
        m = f.measurement
        err = "" if f.error is None else f"{f.error:+.1%}" + (" (lower bound)" if m.bound == "lower" else "")
        t.add_row(f"{m.kind} ({m.per})", ",".join(m.window), f"{m.bytes / GiB:,.2f}",
                  "-" if f.planned_bytes is None else f"{f.planned_bytes / GiB:,.2f}", err, f.peak_phase or "-")
    console.print(t)
    style = "green" if c.agrees else "bold red"
    console.print(Text(f"outcome {case.outcome}; memfit: {_LEVEL.get(c.level, c.level)} "
                       f"({c.gpu_ratio:.0%} of the card at its worst phase): "
                       f"{'agrees' if c.agrees else 'disagrees'}: {c.why}", style=style))
    for n in c.stack_notes:
        console.print(Text(f"stack: {n}", style="dim"))
    for g in case.gaps:
        console.print(Text(f"gap (what the case could not express): {g}", style="dim"))


def case_to_dict(c: CaseComparison) -> dict[str, Any]:
    """The JSON document of ``memfit compare CASE.yaml --json`` (schema memfit.compare_case, version 1)."""
    return {
        "schema": "memfit.compare_case", "schema_version": 1, "id": c.case.id, "source": c.case.url,
        "outcome": c.case.outcome, "planned": not c.error, "error": c.error or None, "framework": c.framework,
        "level": c.level or None, "agrees": c.agrees, "why": c.why, "gpu_ratio": c.gpu_ratio,
        "figures": [{"kind": f.measurement.kind, "window": list(f.measurement.window), "per": f.measurement.per,
                     "measured_bytes": f.measurement.bytes, "planned_bytes": f.planned_bytes,
                     "error": f.error, "bound": f.measurement.bound or None, "peak_phase": f.peak_phase or None,
                     "phases": list(f.phases)} for f in c.figures],
        "gaps": list(c.case.gaps),
        "stack_notes": list(c.stack_notes),
    }
