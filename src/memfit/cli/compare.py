"""``memfit compare``: the plan against the records of a real run."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from memfit.cli.application import app
from memfit.cli.common import check_report_path, console, scenario_command, show_assumptions, warn_inputs, write_new_file
from memfit.errors import MemfitError


@app.command()
@scenario_command(records_follow=True)
def compare(
    scenario: Path = typer.Argument(..., help="Scenario YAML of the run that was recorded (see examples/), or a published-run case (tests/fixtures/public_runs/*.yaml), which carries its own measurements; with --model (the scenario as flags) it is the first record instead, unless it is a .yaml/.yml file."),
    records: Optional[list[Path]] = typer.Argument(None, help=(
        "What the real run left: a memfit.record directory (stats.rank<R>.json, snapshot.rank<R>.pickle), a "
        "torch.cuda.memory._dump_snapshot pickle (read without running anything in it), a JSON of "
        "torch.cuda.memory_stats()/host_memory_stats() per phase, a log with DeepSpeed see_memory_usage lines, "
        "or an nvidia-smi CSV (--query-gpu=timestamp,memory.used --format=csv). Several may be given.")),
    rank: Optional[int] = typer.Option(None, "--rank", help="Which rank's records to compare (default: the lowest recorded)."),
    report: Optional[Path] = typer.Option(None, "--report", help="Also write a report: .html (self-contained, the recording's chart under the plan's) or .md. Never overwrites."),
    json_out: bool = typer.Option(False, "--json", help="Print the reconciliation as JSON (schema memfit.compare, version 1)."),
    *,
    inputs,
) -> None:
    """Reconcile the plan with what a real run recorded: per phase, planned vs recorded allocated,
    reserved, pinned and nvidia-smi memory (GiB = 2^30 B; each recorded figure says its source), the
    snapshot's allocations attributed to ledger items by their stack frames, the allocations the plan
    does not have and the planned ones that never happened, and the allocator simulator's check of the
    recorded alloc/free sequence. Record a run with memfit.record or memfit.integrations.MemfitCallback.

    RECORDS are any of: a memfit.record directory (stats.rank<R>.json, snapshot.rank<R>.pickle); a
    torch.cuda.memory._dump_snapshot pickle (read without running anything in it); a JSON of
    torch.cuda.memory_stats()/host_memory_stats() per phase; a log with DeepSpeed see_memory_usage
    lines ("memory_breakdown": true); an nvidia-smi CSV (--query-gpu=timestamp,memory.used --format=csv).
    Each is read within caps, past which it is one error line: snapshots up to 128 MiB and 300,000
    trace entries, stats JSON up to 64 MiB and 100,000 phases, nvidia-smi CSV up to 32 MiB and
    1,000,000 lines, logs up to 16 MiB; every figure at most 1 EiB.

    Without RECORDS, SCENARIO is a published-run case (tests/fixtures/public_runs/<id>.yaml): its
    measurements (allocated, reserved, nvidia-smi, host RSS, as published) against the plan of its
    inline scenario, like for like over the phases each measurement covers, and the verdict against
    the run's outcome.
    """
    from memfit.core.compare import reconcile
    from memfit.core.plan import make_plan
    from memfit.core.records import read_records
    from memfit.core.scenario.build import build_scenario

    if not records and inputs is None:  # a published-run case (scenario_command leaves it unread)
        _compare_case(scenario, json_out=json_out)
        return
    sc = build_scenario(inputs)
    warn_inputs(sc)
    if report is not None:
        check_report_path(report)
    if not records:
        raise MemfitError("give the records of the run to compare (a memfit.record directory, a snapshot, a "
                          "memory_stats JSON, a log or an nvidia-smi CSV) after the scenario")
    recorded = read_records([str(r) for r in records])  # first: a record refused costs no plan
    plan_result = make_plan(sc)
    rc = reconcile(plan_result, recorded, rank=rank,
                   capacity_bytes=sc.hardware.gpu.total_bytes,
                   host_capacity_bytes=sc.hardware.cpu_ram_bytes // max(sc.hardware.gpus_per_node, 1))
    if report is not None:
        _write_compare_report(report, rc, plan_result, sc)
    if json_out:
        import json

        from memfit.core.figures import headline
        from memfit.render.compare_out import reconciliation_to_dict
        from memfit.render.json_out import headline_to_dict

        typer.echo(json.dumps({**reconciliation_to_dict(rc), "headline": headline_to_dict(headline(plan_result))}, indent=2))
        return
    from memfit.render.compare_out import render_reconciliation

    render_reconciliation(rc, console(), plan=plan_result, sc=sc)
    show_assumptions(sc)


def _compare_case(path: Path, *, json_out: bool) -> None:
    """A published-run case: its measurements against the plan of its inline scenario."""
    from memfit.core.compare.public_run import compare_public_run
    from memfit.core.records.public_run import read_public_run
    from memfit.errors import MemfitError

    try:
        case = read_public_run(path)
    except MemfitError as exc:
        if "not a public-run case" not in str(exc):
            raise
        raise MemfitError(f"{path} is not a published-run case: give the records of the run after the scenario "
                          "(a memfit.record directory, a snapshot, stats JSON, a DeepSpeed log or an nvidia-smi CSV)") from None
    c = compare_public_run(case)
    if c.error:
        raise MemfitError(f"{path}: memfit cannot plan this case: {c.error}")
    if json_out:
        import json

        from memfit.render.public_run_out import case_to_dict

        typer.echo(json.dumps(case_to_dict(c), indent=2))
        return
    from memfit.render.public_run_out import render_case

    render_case(c, console())


def _write_compare_report(path: Path, rc, plan_result, sc) -> None:
    from memfit.render.charts import timeline_chart_svg
    from memfit.render.compare_out import html_sections, markdown_sections
    from memfit.render.report import html_report, markdown_report

    suffix = check_report_path(path)
    title = f"memfit compare: {rc.scenario_name}"
    what = "GPU, per rank" if rc.timeline is None or rc.timeline.device == "gpu" else "host RAM, per process"
    svg = timeline_chart_svg(rc.timeline, f"Recorded, rank {rc.rank}: memory over the run ({what})") if rc.timeline else None
    if suffix == ".md":
        out = markdown_report(plan_result, sc, title=title, markdown=markdown_sections(rc, svg))
    else:
        out = html_report(plan_result, sc, sections=html_sections(rc), title=title,
                          figures=(("recording-chart", svg),) if svg else ())
    write_new_file(path, out, what="--report")
    console(stderr=True).print(f"report written to {path}")
