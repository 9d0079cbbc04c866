"""``memfit recommend``: the configurations that fit, ranked, with their files."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from memfit.cli.application import app
from memfit.cli.common import check_report_path, console, scenario_command, show_assumptions, warn_inputs, write_report
from memfit.errors import MemfitError


@app.command()
@scenario_command
def recommend(
    scenario: Optional[Path] = typer.Argument(None, help="Scenario YAML file (see examples/): your model, DeepSpeed JSON, hardware; or give them as flags."),
    top: int = typer.Option(5, "--top", help="Configurations to return."),
    out: Optional[Path] = typer.Option(None, "--out", help="Directory to write each configuration's DeepSpeed JSON, script diff and scenario file (never overwrites)."),
    headroom: Optional[float] = typer.Option(None, "--headroom", help="Fraction of GPU memory and of host RAM to keep free in every phase (default: the verdict's own margins, measured on published runs, and the OS reserve of the host's RAM)."),
    report: Optional[Path] = typer.Option(None, "--report", help="Also write a report (.html or .md): the recommendations, then your configuration's plan with its charts. Never overwrites."),
    json_out: bool = typer.Option(False, "--json", help="Print the recommendations as JSON."),
    *,
    inputs,
) -> None:
    """Search the settings you can change (under DeepSpeed: ZeRO stage, offload, pinning, zero.Init,
    load dtype, buckets, bf16/fp16; otherwise: framework, FSDP sharding and offload, precision mode,
    optimizer, 4-bit base; always micro-batch vs accumulation and checkpointing) for configurations that
    fit every phase with headroom, ranked by an estimated step time; each is confirmed by the exact ledger."""
    import math
    import time

    from memfit.core.recommend import recommend as run_recommend

    if headroom is not None and not (math.isfinite(headroom) and 0 <= headroom < 1):
        raise MemfitError(f"--headroom must be a fraction from 0 to below 1, got {headroom}")
    if top < 1:
        raise MemfitError(f"--top must be at least 1, got {top}")
    if report is not None:
        check_report_path(report)
    from memfit.core.scenario.build import build_scenario as _build

    given = _build(inputs)
    warn_inputs(given)  # what DeepSpeed would ignore in the user's config, said before the search
    if out is not None and out.exists() and not out.is_dir():
        raise MemfitError(f"--out {out} exists and is not a directory")
    started = time.perf_counter()
    bar: dict = {}

    def progress(done: int, total: int) -> None:  # shown only once the search has run a second, on a terminal
        if "p" not in bar and (time.perf_counter() - started < 1.0 or not sys.stderr.isatty()):
            return
        if "p" not in bar:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            bar["p"] = Progress(TextColumn("searching configurations"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=console(stderr=True), transient=True)
            bar["p"].start()
            bar["t"] = bar["p"].add_task("search", total=total)
        bar["p"].update(bar["t"], completed=done, total=total)

    try:
        result = run_recommend(inputs, top=top, headroom=headroom, progress=progress)
    finally:
        if "p" in bar:
            bar["p"].stop()
    if out is not None:
        from memfit.core.recommend.files import write_recommendations

        result = write_recommendations(result, out)
    if report is not None:
        from memfit.core.scenario.build import build_scenario
        from memfit.render.recommend_out import render_recommendations as _render
        from memfit.render.report import fix_chart_svgs

        sc = build_scenario(inputs)
        fix = next((r for r in result.recommendations if r.changes), None)
        figures = fix_chart_svgs(result.baseline, fix.plan, sc, label=f"recommendation #{fix.rank}") if fix else ()
        write_report(report, result.baseline, sc, title=f"memfit recommend: {result.scenario_name}",
                     render=lambda console: _render(result, console), heading="Configurations that fit", figures=figures)
    if json_out:
        import json

        from memfit.render.recommend_out import recommendations_to_dict

        typer.echo(json.dumps(recommendations_to_dict(result), indent=2))
        return
    from memfit.render.recommend_out import render_recommendations

    render_recommendations(result, console())
    show_assumptions(given)
