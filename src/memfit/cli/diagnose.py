"""``memfit diagnose``: what a traceback or log says failed, in which phase, against the plan."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from memfit.cli.application import app
from memfit.cli.common import check_report_path, console, scenario_command, show_assumptions, warn_inputs, write_report


@app.command()
@scenario_command
def diagnose(
    scenario: Optional[Path] = typer.Argument(None, help="Scenario YAML (see examples/), or the scenario's flags, to reconcile the log's figures with the plan."),
    log: str = typer.Option(..., "--log", "-l", help="The pasted traceback or log file (- reads standard input); noise, colours and interleaved ranks are fine."),
    report: Optional[Path] = typer.Option(None, "--report", help="Also write a report (.html or .md): the diagnosis, then the plan with its charts. Never overwrites."),
    json_out: bool = typer.Option(False, "--json", help="Print the diagnosis as JSON."),
    *,
    inputs,
) -> None:
    """Read a traceback or log: what failed (CUDA or host out of memory, a failed pinned allocation,
    NCCL, an op build), in which phase and why, with the usual fixes; with a scenario, how the log's
    figures compare with the plan's ledger. Exit status 1 if the log has no recognisable error."""
    from memfit.core.diagnose import MEMORY_KINDS, diagnose_log, read_log

    text = read_log(log)
    sc = result = None
    if scenario is not None or inputs.origins:  # a scenario, as a file or as flags
        from memfit.core.plan import make_plan
        from memfit.core.scenario.build import build_scenario

        sc = build_scenario(inputs)
        warn_inputs(sc)
        result = make_plan(sc)
    if report is not None:
        check_report_path(report)
    found = diagnose_log(text, result, sc)
    if found.primary is not None and (found.primary.kind in MEMORY_KINDS or found.primary.out_of_memory):
        from dataclasses import replace

        from memfit.core.diagnose.next_step import NO_SCENARIO, smallest_fit

        fits = found.reconciliation is not None and found.reconciliation.plan_verdict == "not_predicted"
        command = f"memfit recommend {scenario}" if scenario is not None else "memfit recommend <the same flags>"
        found = replace(found, next_step=(smallest_fit(inputs, command=command, plan_fits=fits)  # inputs as resolved
                                          if sc is not None else (NO_SCENARIO,)))
    if found.primary is None:
        print(f"memfit: {found.headline} ({log}): looked for CUDA and host out-of-memory errors, failed pinned "
              f"allocations, NCCL errors and DeepSpeed op build failures", file=sys.stderr)
        sys.exit(1)  # typer.Exit would be swallowed by main()'s standalone_mode=False
    if report is not None:
        from memfit.render.diagnose_out import render_diagnosis as _render

        write_report(report, result, sc, title=f"memfit diagnose: {found.headline}",
                      render=lambda console: _render(found, console), heading="Diagnosis")
    if json_out:
        import json

        from memfit.render.diagnose_out import diagnosis_to_dict

        typer.echo(json.dumps(diagnosis_to_dict(found), indent=2))
        return
    from memfit.render.diagnose_out import render_diagnosis

    render_diagnosis(found, console())
    if sc is not None:
        show_assumptions(sc)
