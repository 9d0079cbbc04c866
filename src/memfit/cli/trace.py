"""``memfit trace``: what is live at the forward and backward peaks of a traced step."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from memfit.cli.application import app
from memfit.cli.common import console, scenario_command, show_assumptions, trace_with_progress, warn_inputs


@app.command()
@scenario_command
def trace(
    scenario: Optional[Path] = typer.Argument(None, help="Scenario YAML file (see examples/). Flags override it."),
    top: int = typer.Option(12, min=0, help="Modules to list at each peak."),
    json_out: bool = typer.Option(False, "--json", help="Print the breakdown as JSON."),
    *,
    inputs,
) -> None:
    """Trace one training step (forward, loss, backward) of the real model code on fake tensors and
    show what is live at the forward and backward peaks, by category and by module. No GPU needed."""
    from memfit.core.scenario.build import build_scenario
    from memfit.render.trace_out import render_trace, trace_to_dict

    sc = build_scenario(inputs)
    warn_inputs(sc)
    result = trace_with_progress(sc)
    z3 = None
    if sc.deepspeed.zero.stage == 3:
        from memfit.trace.deepspeed.zero3_step import zero3_step_memory

        z3 = zero3_step_memory(result, sc.deepspeed, sc.world_size)
    if json_out:
        import json

        typer.echo(json.dumps(trace_to_dict(result, z3), indent=2))
        return
    render_trace(result, z3, console(), top=top)
    show_assumptions(sc)
