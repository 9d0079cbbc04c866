"""The one short block of assumed values (``Scenario.assumptions``): what no input gave, grouped as
hardware, lengths, stack and defaults, each with where it comes from. Never recomputes anything."""

from __future__ import annotations

KINDS = ("hardware", "lengths", "stack", "defaults")


def assumption_lines(assumptions) -> list[str]:
    """``assumed (not given): ...`` then one line per group that has any."""
    if not assumptions:
        return []
    lines = ["assumed (no input gave these; each names what sets it):"]
    for kind in KINDS:
        items = [a for a in assumptions if a.kind == kind]
        if items:
            lines.append(f"  {kind:<9} " + "; ".join(f"{a.what} {a.value} ({a.why})" for a in items))
    return lines


def render_assumptions(sc, console) -> None:
    from rich.text import Text

    lines = assumption_lines(sc.assumptions)
    if lines:
        console.print(Text("\n".join(lines), style="dim"))
