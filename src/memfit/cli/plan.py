"""``memfit plan``: the phase-by-phase ledger, verdict and findings of one scenario."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from memfit.cli.application import app
from memfit.cli.common import check_report_path, console, scenario_command, trace_with_progress, warn_inputs, write_report


@app.command()
@scenario_command
def plan(
    scenario: Optional[Path] = typer.Argument(None, help="Scenario YAML file (see examples/). Flags override it."),
    report: Optional[Path] = typer.Option(None, "--report", help="Also write a report: .html (charts, self-contained) or .md. Never overwrites a file."),
    exact: bool = typer.Option(False, "--exact", help="Trace forward/backward from the model's code (needs torch, transformers, peft; seconds) instead of the analytic activation estimate. Every framework; refused in one line where the trace cannot build the model (a bitsandbytes-quantized base). Each trace is kept in ~/.cache/memfit/traces (or $MEMFIT_CACHE_DIR) and read back while the model, options, libraries and memfit are the same; MEMFIT_NO_CACHE=1 traces again."),
    json_out: bool = typer.Option(False, "--json", help="Print the plan as JSON (schema: docs/json-schema.md)."),
    all_items: bool = typer.Option(False, "--all-items", help="Show every phase's ledger items, not only the peaks'."),
    *,
    inputs,
) -> None:
    """Phase-by-phase memory ledger, verdict and findings for one scenario.

    Activations are analytic unless --exact is given (then traced with torch's FakeTensorMode, no GPU
    needed); everything DeepSpeed allocates is computed from its code either way.
    """
    from memfit.core.plan import make_plan
    from memfit.core.scenario.build import build_scenario

    sc = build_scenario(inputs)
    warn_inputs(sc)
    if report is not None:
        check_report_path(report)  # before any work: a bad path fails fast
    traced = None
    if exact and sc.framework != "deepspeed":
        from memfit.trace.ledger_step import torch_trace_options

        torch_trace_options(sc)  # refuses in one line, before tracing, what the trace cannot build
    if sc.model.source == "meta" and not exact:  # no pure builder: its activations come from a trace
        for note in sc.model.notes:
            console(stderr=True).print(f"memfit: {note}")
        exact = True
        if sc.framework != "deepspeed":
            from memfit.errors import MemfitError
            from memfit.trace.ledger_step import torch_trace_options

            try:
                torch_trace_options(sc)
            except MemfitError as e:
                exact = False
                console(stderr=True).print(f"memfit: not traced ({e}); its activations are the analytic estimate "
                                           "from the config's shapes")
    if exact:
        from memfit.trace.ledger_step import ledger_step

        traced = ledger_step(sc, trace_with_progress(sc))
    result = make_plan(sc, traced)
    if report is not None:
        write_report(report, result, sc)
    if json_out:
        import json

        from memfit.render.json_out import plan_to_dict
        from memfit.core.scenario.build import describe_scenario

        typer.echo(json.dumps(plan_to_dict(result, scenario=describe_scenario(sc)), indent=2))
        return
    from memfit.render.terminal import render_plan

    render_plan(result, sc, console(), all_items=all_items)
