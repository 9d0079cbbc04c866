"""Reports a person can read or share: a self-contained HTML page (charts inline) or Markdown."""

from __future__ import annotations

from html import escape

from memfit.core.ledger_types import Plan
from memfit.core.scenario.types import Scenario
from memfit.core.figures import VERDICT_TAG, gpu_verdict_name, headline, HOST_NODE
from memfit.render.charts import grouped_chart_svg, phase_chart_svg
from memfit.core.verdict import gpu_figure, host_figure
from memfit.render.summary import headline_lines
from memfit.render.terminal import scenario_summary

GiB = 2**30
_CSS = """
body{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;color:#222;line-height:1.4}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em}table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
td,th{border:1px solid #ccc;padding:3px 6px;vertical-align:top}th{background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}
.fail{color:#b00;font-weight:bold}tr.fail td{background:#fde8e8}#headline{margin:.3em 0 1em}.ok{color:#070;font-weight:bold}.risk{color:#a60;font-weight:bold}.error{color:#b00}.warning{color:#a60}.info{color:#036}
pre{background:#f7f7f7;padding:.6em;white-space:pre-wrap}small{color:#666}
"""


def _verdict(plan: Plan) -> tuple[str, str]:
    """The verdict's lines (``terminal.verdict_lines``) and the CSS class of its level."""
    from memfit.render.terminal import verdict_lines

    lines = verdict_lines(plan)
    return " ".join(line.strip() for line, _ in lines), {"fits": "ok", "at_risk": "risk"}.get(plan.verdict.level, "fail")


def rich_fragment(render, *, width: int = 110) -> tuple[str, str]:
    """Run a terminal renderer into a recording console: (HTML fragment, plain text)."""
    import io

    from rich.console import Console

    console = Console(record=True, width=width, file=io.StringIO(), color_system="truecolor", markup=False)
    render(console)
    text = console.export_text(clear=False)
    html = console.export_html(inline_styles=True, code_format="<pre style=\"font-size:.8em\">{code}</pre>")
    return html, text


def section_page(title: str, sections: tuple[tuple[str, str], ...]) -> str:
    """A page of sections only (a diagnosis without a scenario)."""
    body = "".join(f"<h2>{escape(h)}</h2>{frag}" for h, frag in sections)
    return (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{escape(title)}</title>"
            f"<style>{_CSS}</style></head><body><h1>{escape(title)}</h1>{body}</body></html>")


def html_report(plan: Plan, sc: Scenario, *, sections: tuple[tuple[str, str], ...] = (), title: str | None = None,
                figures: tuple[tuple[str, str], ...] = ()) -> str:
    """The plan's page; ``sections`` (heading, HTML) come first (a diagnosis, recommendations);
    ``figures`` (id, SVG) are drawn under the plan's charts (a recording over time)."""
    verdict, level_class = _verdict(plan)
    extra = "".join(f"<h2>{escape(h)}</h2>{frag}" for h, frag in sections)
    hw = sc.hardware
    h = headline(plan)
    figures_html = "".join(f'<li class="figure">{escape(line)}</li>' for line in
                           headline_lines(h, hw.gpu.total_bytes, hw.cpu_ram_bytes))
    failed = {(f.phase, f.device) for f in plan.verdict.failures}
    rows = "".join(
        f"<tr{' class=fail' if any((p.name, d) in failed for d in ('gpu', 'cpu', 'nvme')) else ''}>"
        f"<td>{escape(p.name)}</td><td class=n>{p.gpu_allocated_bytes / GiB:.2f}</td>"
        f"<td class=n>{p.gpu_reserved_bytes / GiB:.2f}</td><td class=n>{gpu_figure(p) / GiB:.2f}</td>"
        f"<td class=n>{p.cpu_pinned_locked_bytes / GiB:.2f}</td>"
        f"<td class=n>{p.cpu_pageable_bytes / GiB:.2f}</td><td class=n>{host_figure(p) / GiB:.2f}</td></tr>"
        for p in plan.phases)
    ledgers = []
    for p in plan.phases:
        items = "".join(
            f"<tr><td>{escape(i.name)}{'' if i.exact else ' <small>(estimate)</small>'}</td><td>{escape(i.device.value)}</td>"
            f"<td class=n>{i.bytes:,}</td><td class=n>{i.bytes / GiB:.3f}</td><td>{escape(i.formula)}<br><small>{escape(i.source)}</small></td></tr>"
            for i in sorted(p.items, key=lambda i: (i.device.value, -i.bytes)))
        ledgers.append(f"<h3>{escape(p.name)}</h3><p>{escape(p.description)}</p><table><tr><th>item</th><th>where</th>"
                       f"<th>bytes</th><th>GiB</th><th>formula / code</th></tr>{items}</table>")
    findings = "".join(f"<li class={escape(f.severity)}><b>[{escape(f.severity)}]</b> {escape(f.message)}</li>" for f in plan.findings)
    notes = "".join(f"<li>{escape(n)}</li>" for n in plan.notes)
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>memfit: {escape(plan.scenario_name)}</title>
<style>{_CSS}</style></head><body>
<h1>{escape(title or "memfit plan: " + plan.scenario_name)}</h1>
{extra}
<h2>The plan{": " + escape(plan.scenario_name) if title else ""}</h2>
<p class="{level_class}" id="verdict">{escape(verdict)}</p>
<ul id="headline" data-gpu-bytes="{h.gpu.bytes}" data-gpu-name="{escape(h.gpu.name)}" data-host-bytes="{h.host.bytes}">{figures_html}</ul>
<pre>{escape(scenario_summary(sc).plain)}</pre>
<h2>Memory over the run</h2>
<figure id="gpu-chart">{phase_chart_svg(plan, "gpu", hw.gpu.total_bytes, f"GPU per rank ({hw.gpu.name}): {gpu_verdict_name(plan)} per phase ({VERDICT_TAG})")}</figure>
<figure id="host-chart">{phase_chart_svg(plan, "host", hw.cpu_ram_bytes, f"Host RAM per node ({hw.gpus_per_node} rank(s)): {HOST_NODE} per phase ({VERDICT_TAG})")}</figure>
{"".join(f'<figure id="{escape(fid)}">{svg}</figure>' for fid, svg in figures)}
<h2>Peaks per phase (GiB = 2<sup>30</sup> bytes)</h2>
<table><tr><th>phase</th><th>GPU allocated / rank</th><th>GPU reserved / rank</th><th>{escape(gpu_verdict_name(plan))} / rank ({VERDICT_TAG})</th><th>pinned locked / rank</th><th>pageable / rank</th><th>host / node ({VERDICT_TAG})</th></tr>{rows}</table>
<h2>Findings</h2><ul>{findings}</ul>
<h2>Ledger: what is live at each phase's peak</h2>{''.join(ledgers)}
<h2>Notes</h2><ul>{notes}</ul>
<p><small>Generated by memfit. Bytes are per rank unless marked per node.</small></p>
</body></html>"""


def markdown_report(plan: Plan | None, sc: Scenario | None, *, sections: tuple[tuple[str, str], ...] = (),
                    title: str | None = None, markdown: str = "") -> str:
    """``sections`` are (heading, plain text) shown first, in code blocks; ``markdown`` is inserted
    as it is before them (tables of a comparison)."""
    head = [f"# {title or 'memfit plan: ' + plan.scenario_name}", ""]
    if markdown:
        head += [markdown.rstrip(), ""]
    for h, text in sections:
        head += [f"## {h}", "", "```", text.rstrip(), "```", ""]
    if plan is None or sc is None:
        return "\n".join(head)
    verdict, _ = _verdict(plan)
    figure_lines = [f"- {line.strip()}" for line in headline_lines(headline(plan), sc.hardware.gpu.total_bytes,
                                                                    sc.hardware.cpu_ram_bytes)]
    lines = head + [f"## The plan: {plan.scenario_name}", "", f"**{verdict}**", "", *figure_lines, "", "```",
                    scenario_summary(sc).plain, "```", "", "## Peaks per phase (GiB = 2^30 bytes)", "",
             "| phase | GPU allocated / rank | GPU reserved / rank | GPU OOM-relevant / rank | pinned locked / rank "
             "| pageable / rank | host / node |", "|---|---:|---:|---:|---:|---:|---:|"]
    for p in plan.phases:
        lines.append(f"| {p.name} | {p.gpu_allocated_bytes / GiB:.2f} | {p.gpu_reserved_bytes / GiB:.2f} | "
                     f"{gpu_figure(p) / GiB:.2f} | {p.cpu_pinned_locked_bytes / GiB:.2f} | "
                     f"{p.cpu_pageable_bytes / GiB:.2f} | {host_figure(p) / GiB:.2f} |")
    lines += ["", "## Findings", ""] + [f"- **{f.severity}**: {f.message}" for f in plan.findings]
    lines += ["", "## Ledger", ""]
    for p in plan.phases:
        lines += [f"### {p.name}", "", p.description, "", "| item | where | bytes | formula | code |", "|---|---|---:|---|---|"]
        for i in sorted(p.items, key=lambda i: (i.device.value, -i.bytes)):
            lines.append(f"| {i.name}{'' if i.exact else ' (estimate)'} | {i.device.value} | {i.bytes:,} | "
                         f"{i.formula.replace('|', '/')} | `{i.source}` |")
        lines.append("")
    lines += ["## Notes", ""] + [f"- {n}" for n in plan.notes]
    return "\n".join(lines) + "\n"


def fix_chart_svgs(base: Plan, fix: Plan, sc: Scenario, *, label: str) -> tuple[tuple[str, str], ...]:
    """The recommended configuration charted beside the user's: per phase, the verdict's GPU and host
    figures of both (``recommend --report``)."""
    hw = sc.hardware
    plans = [("your configuration", base), (label, fix)]
    return (("fix-gpu-chart", grouped_chart_svg(plans, "gpu", hw.gpu.total_bytes,
                                                f"GPU per rank: {gpu_verdict_name(base)}, yours and {label}",
                                                failing={f.phase for f in base.verdict.failures if f.device == "gpu"})),
            ("fix-host-chart", grouped_chart_svg(plans, "host", hw.cpu_ram_bytes,
                                                 f"Host RAM per node: {HOST_NODE}, yours and {label}",
                                                 failing={f.phase for f in base.verdict.failures if f.device == "cpu"})))
