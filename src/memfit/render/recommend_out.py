"""``memfit recommend`` output: a ranked table for the terminal and a JSON document.

Sizes in GiB (2**30 bytes); the JSON carries exact byte counts. Renderers never recompute: the
numbers are the exact ledger's (``Recommendation.plan``) and the step-time estimate's.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from memfit import __version__
from memfit.core.figures import VERDICT_TAG, headline
from memfit.core.recommend.results import Recommendation, RecommendResult
from memfit.core.units import fmt_bytes
from memfit.render.json_out import headline_to_dict, plan_to_dict

GiB = 2**30
STEP_TIME_NOTE = ("est. step = compute + communication + offload traffic per optimizer step, no overlap "
                  "assumed: an estimate for ranking, not a prediction (memfit.core.recommend.step_time).")


def _changes(rec: Recommendation) -> str:
    if not rec.changes:
        return "(your configuration as it is)"
    return "; ".join(f"{c.setting} {c.before}->{c.after}" for c in rec.changes)


def _seconds(s: float) -> str:
    return f"{s:.3f}" if s < 1 else f"{s:,.2f}" if s < 100 else f"{s:,.0f}"


def diff_text(diff: str) -> Text:
    """A unified diff, coloured by line (wraps instead of cutting long lines)."""
    out = Text()
    for line in diff.rstrip("\n").splitlines():
        style = ("bold" if line.startswith(("---", "+++")) else "green" if line.startswith("+")
                 else "red" if line.startswith("-") else "cyan" if line.startswith("@@") else "")
        out.append(line + "\n", style=style)
    out.rstrip()
    return out


_LEVEL = {"fits": "fits", "at_risk": "at risk", "does_not_fit": "does not fit"}
_LEVEL_STYLE = {"fits": "green", "at_risk": "yellow", "does_not_fit": "bold red"}


def recommendation_table(result: RecommendResult) -> Table:
    """One row per configuration; the figures are the verdict's (``memfit.core.figures``), from the
    exact ledger, named in the title."""
    h = headline(result.baseline)
    t = Table(title=f"Configurations that fit with {result.headroom_words}, fastest first. GPU: "
                    f"{h.gpu.name} per rank; host: {h.host.name} ({VERDICT_TAG}s, exact ledger; GiB = 2^30 B)",
              title_justify="left", show_lines=True)
    t.add_column("#", justify="right", no_wrap=True)
    t.add_column("what changes", overflow="fold")
    t.add_column("GPU\n/rank", justify="right", no_wrap=True)
    t.add_column("host\n/node", justify="right", no_wrap=True)
    t.add_column("est.\nstep s", justify="right", no_wrap=True)
    t.add_column("verdict", no_wrap=True)
    for rec in result.recommendations:
        rh = rec.headline
        t.add_row(str(rec.rank), _changes(rec), f"{rh.gpu.bytes / GiB:,.2f}",
                  f"{rh.host.bytes / GiB:,.2f}", _seconds(rec.step_time.total_s),
                  Text(_LEVEL[rec.plan.verdict.level], style=_LEVEL_STYLE[rec.plan.verdict.level]))
    return t


def _baseline_text(result: RecommendResult) -> Text:
    """Your configuration's figures: the plan's verdict figures, by the plan's names."""
    v = result.baseline.verdict
    h = headline(result.baseline)
    hw = result.hardware
    line = (f"your configuration: {h.gpu.name} {fmt_bytes(h.gpu.bytes)} of {fmt_bytes(hw.gpu.total_bytes)} per "
            f"rank ({h.gpu.phase}), {h.host.name} {fmt_bytes(h.host.bytes)} of {fmt_bytes(hw.cpu_ram_bytes)} "
            f"({h.host.phase}): ")
    if not v.fits:
        f = v.failures[0]
        where = {"gpu": "GPU", "cpu": "host RAM", "nvme": "NVMe"}[f.device]
        return Text(line) + Text(f"does not fit ({where} in phase {f.phase})", style="bold red")
    if result.headroom is None:
        return Text(line) + Text(_LEVEL[v.level], style=_LEVEL_STYLE[v.level])
    if not result.baseline_fits_with_headroom:
        return Text(line) + Text(f"fits, but not with {result.headroom_words}"
                                 + (" (at risk)" if v.level == "at_risk" else ""), style="yellow")
    return Text(line) + Text(f"fits with {result.headroom_words}", style="green")


def render_recommendations(result: RecommendResult, console: Console, *, diffs: int = 3) -> None:
    """The ranked table, then each recommendation's files and script diff (the first ``diffs``)."""
    head = Text.assemble(
        _baseline_text(result), "\n",
        f"searched {result.candidates_searched:,} configurations in {result.search_seconds:.2f} s "
        f"({result.candidates_per_second:,.0f}/s); {result.candidates_fitting:,} fit every phase with "
        f"{result.headroom_words} (GPU <= {fmt_bytes(result.gpu_limit_bytes)}, host <= "
        f"{fmt_bytes(result.host_limit_bytes)} per node)")
    console.print(Panel(head, title=Text(f"memfit recommend: {result.scenario_name}"), title_align="left"))
    if not result.recommendations:
        console.print(Text("No configuration in the search space fits.", style="bold red"))
    else:
        console.print(recommendation_table(result))
        for rec in result.recommendations[:diffs]:
            console.print(Text(f"#{rec.rank}: {_changes(rec)}", style="bold"))
            if rec.files:
                console.print(Text("  written: " + ", ".join(rec.files)))
            for name, diff in rec.file_diffs:
                console.print(Text(f"  new {name}:" if diff.startswith("--- /dev/null") else f"  your {name} changes:",
                                   style="dim"))
                console.print(diff_text(diff))
            if rec.script_diff:
                console.print(diff_text(rec.script_diff))
            if not rec.file_diffs and not rec.script_diff:
                console.print(Text("  no change to your files or script" if not rec.changes else
                                   "  the change is in the scenario only (memfit's own settings)", style="dim"))
            for n in rec.notes:
                console.print(Text(f"  note: {n}", style="yellow"))
        if not any(rec.files for rec in result.recommendations):
            console.print(Text("(--out DIR writes, per configuration, your files changed with a diff of each, the "
                               "script's diff and a scenario.yaml that `memfit plan` runs)", style="dim"))
    console.print(Text(STEP_TIME_NOTE, style="dim"))
    console.print(Text(f"fast estimate vs exact ledger: largest difference "
                       f"{result.max_fast_exact_diff_bytes:,} B over the configurations shown", style="dim"))
    for n in result.notes:
        console.print(Text(f"note: {n}", style="dim"))


def _phases(rec: Recommendation) -> list[dict[str, Any]]:
    return [{"name": p.name, "gpu_peak_bytes": p.gpu_peak_bytes, "cpu_peak_bytes": p.cpu_peak_bytes,
             "node_cpu_peak_bytes": p.node_cpu_peak_bytes, "nvme_bytes": p.nvme_bytes,
             "fast_gpu_peak_bytes": f.gpu_peak_bytes, "fast_cpu_peak_bytes": f.cpu_peak_bytes,
             "fast_node_cpu_peak_bytes": f.node_cpu_peak_bytes, "fast_nvme_bytes": f.nvme_bytes}
            for p, f in zip(rec.plan.phases, rec.fast_phases)]


def recommendations_to_dict(result: RecommendResult) -> dict[str, Any]:
    """The JSON document of ``memfit recommend --json`` (byte counts are integers)."""
    base = result.baseline
    return {
        "memfit_version": __version__,
        "scenario": result.scenario_name,
        "headroom": result.headroom,
        "gpu_limit_bytes": result.gpu_limit_bytes,
        "host_limit_bytes": result.host_limit_bytes,
        "baseline": {
            "fits": base.verdict.fits,
            "level": base.verdict.level,
            "fits_with_headroom": result.baseline_fits_with_headroom,
            "gpu_peak_bytes": max(p.gpu_peak_bytes for p in base.phases),
            "node_cpu_peak_bytes": max(p.node_cpu_peak_bytes for p in base.phases),
            "headline": headline_to_dict(headline(base)),
            "failures": [{"phase": f.phase, "device": f.device, "needed_bytes": f.needed_bytes,
                          "available_bytes": f.available_bytes} for f in base.verdict.failures],
            "est_step_seconds": result.baseline_step_time.total_s,
        },
        "search": {"candidates": result.candidates_searched, "fitting": result.candidates_fitting,
                   "seconds": result.search_seconds, "candidates_per_second": result.candidates_per_second,
                   "max_fast_exact_diff_bytes": result.max_fast_exact_diff_bytes},
        "recommendations": [
            {
                "rank": rec.rank,
                "changes": [{"setting": c.setting, "before": c.before, "after": c.after} for c in rec.changes],
                "settings": asdict(rec.candidate),
                "gpu_peak_bytes": rec.gpu_peak_bytes,
                "node_cpu_peak_bytes": rec.node_cpu_peak_bytes,
                "headline": headline_to_dict(rec.headline),
                "fits": rec.plan.verdict.fits,
                "level": rec.plan.verdict.level,
                "est_step": {"total_seconds": rec.step_time.total_s, "compute_seconds": rec.step_time.compute_s,
                             "communication_seconds": rec.step_time.communication_s,
                             "offload_seconds": rec.step_time.offload_s,
                             "tokens_per_step": rec.step_time.tokens_per_step},
                "phases": _phases(rec),
                "plan": plan_to_dict(rec.plan),
                "deepspeed_json": rec.deepspeed_json,
                "script_diff": rec.script_diff,
                "file_diffs": [{"file": name, "diff": diff} for name, diff in rec.file_diffs],
                "files": list(rec.files),
                "notes": list(rec.notes),
            }
            for rec in result.recommendations
        ],
        "notes": [STEP_TIME_NOTE, *result.notes],
    }
