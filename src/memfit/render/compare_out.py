"""Output of ``memfit compare``: terminal tables, JSON, Markdown and HTML sections. Presentation only."""

from __future__ import annotations

import base64
from html import escape
from typing import Any

from memfit.core.compare.types import QUANTITIES, QUANTITY_TITLES, Cell, Figure, Reconciliation

GiB = 2**30
SCHEMA_VERSION = 1
SOURCE_TAGS = {"snapshot trace": "T", "memory_stats": "S", "host_memory_stats": "H", "deepspeed log": "D",
               "nvidia-smi": "N", "mem_get_info": "M", "plan": "", "plan estimate": "~"}
LEGEND = ("T snapshot trace (requested bytes, exact) | S memory_stats | H host_memory_stats (pinned blocks held) | "
          "D DeepSpeed see_memory_usage (rounded) | N nvidia-smi samples | M mem_get_info at phase end | "
          "~ plan estimate | - not given")


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GiB:,.2f}"


def _fig(f: Figure | None) -> str:
    if f is None:
        return "-"
    tag = SOURCE_TAGS.get(f.source, "?")
    tol = f" +-{f.tolerance_bytes / GiB:.2f}" if f.tolerance_bytes >= GiB // 20 else ""
    return f"{_gib(f.bytes)}{tol}" + (f" {tag}" if tag else "")


def _diff(c: Cell) -> str:
    d = c.diff_bytes
    if d is None:
        return ""
    rel = c.rel_diff
    return f"{d / GiB:+,.2f}" + (f" ({rel:+.0%})" if rel is not None and abs(rel) < 100 else "")


# ---------------------------------------------------------------------------------------- dicts

def _figure_dict(f: Figure | None) -> dict[str, Any] | None:
    if f is None:
        return None
    return {"bytes": f.bytes, "source": f.source, "tolerance_bytes": f.tolerance_bytes, "note": f.note}


def reconciliation_to_dict(rc: Reconciliation) -> dict[str, Any]:
    from memfit import __version__

    out: dict[str, Any] = {
        "schema": "memfit.compare", "schema_version": SCHEMA_VERSION, "memfit_version": __version__,
        "scenario": rc.scenario_name, "rank": rc.rank, "ranks": list(rc.ranks),
        "records": [{"path": r.path, "kind": r.kind, "provides": list(r.provides), "detail": r.detail} for r in rc.records],
        "phases": [
            {"phase": row.phase, "plan_phases": list(row.plan_phases), "occurrences": row.occurrences, "note": row.note,
             **{q: {"planned": _figure_dict(row.cell(q).planned),
                    "recorded": [_figure_dict(f) for f in row.cell(q).recorded],
                    "diff_bytes": row.cell(q).diff_bytes} for q in QUANTITIES}}
            for row in rc.rows],
        "notes": list(rc.notes),
        "deepspeed_reports": [{"message": m, "phase": p, "allocated_bytes": a, "peak_allocated_bytes": pk}
                              for m, p, a, pk in rc.ds_reports],
    }
    a = rc.attribution
    out["attribution"] = None if a is None else {
        "trace_events": a.trace_events,
        "phases": [{"phase": p.phase, "plan_phase": p.plan_phase, "peak_bytes": p.peak_bytes, "peak_time_us": p.peak_time_us,
                    "unattributed_bytes": p.unattributed_bytes, "before_trace_bytes": p.before_trace_bytes,
                    "items": [{"keys": list(k.keys), "name": k.name, "planned_bytes": k.planned_bytes,
                               "recorded_bytes": k.recorded_bytes, "diff_bytes": k.diff_bytes, "exact": k.exact}
                              for k in p.rows]} for p in a.phases],
        "unplanned": [{"where": u.where, "keys": list(u.keys), "peak_live_bytes": u.peak_live_bytes, "count": u.count,
                       "phases": list(u.phases), "stack": list(u.stack)} for u in a.unplanned],
        "missing": [{"key": m.key, "name": m.name, "planned_bytes": m.planned_bytes, "phases": list(m.phases),
                     "reason": m.reason} for m in a.missing],
        "not_visible": list(a.not_visible), "rules": list(a.rules), "notes": list(a.notes)}
    s = rc.simulator
    out["simulator"] = None if s is None else {
        "status": s.status, "device": s.device, "events": s.events,
        "recorded_reserved_peak_bytes": s.recorded_reserved_peak_bytes,
        "simulated_reserved_peak_bytes": s.simulated_reserved_peak_bytes, "divergences": list(s.divergences),
        "reason": s.reason}
    return out


# ------------------------------------------------------------------------------------- terminal

def compared_quantities(rc: Reconciliation) -> tuple[str, ...]:
    """The quantities some record gives (the others are the plan's alone: not shown as columns)."""
    got = tuple(q for q in QUANTITIES if any(row.cell(q).recorded for row in rc.rows))
    return got or QUANTITIES


def render_reconciliation(rc: Reconciliation, console, *, plan=None, sc=None) -> None:
    """The records, the plan vs recording table (the quantities some record gives), attribution.
    ``plan``/``sc``: the plan's verdict and its figures first, named as everywhere."""
    from rich.table import Table
    from rich.text import Text

    console.print(Text(f"memfit compare: {rc.scenario_name}: rank {rc.rank}"
                       + (f" (records hold ranks {', '.join(map(str, rc.ranks))})" if len(rc.ranks) > 1 else ""), style="bold"))
    if plan is not None and sc is not None:
        from memfit.core.figures import headline
        from memfit.render.summary import headline_lines, verdict_sentence

        console.print(Text("plan: " + verdict_sentence(plan)))
        for line in headline_lines(headline(plan), sc.hardware.gpu.total_bytes, sc.hardware.cpu_ram_bytes):
            console.print(Text("  " + line, style="dim"))
    rt = Table(title="Records", title_justify="left", show_lines=False)
    for col in ("file", "kind", "provides", "detail"):
        rt.add_column(col)
    for r in rc.records:
        rt.add_row(r.path, r.kind, ", ".join(r.provides), r.detail)
    console.print(rt)
    shown = compared_quantities(rc)
    t = Table(title="Plan vs recording per phase (GiB = 2^30 B; GPU per rank, pinned and host RAM per process)",
              title_justify="left")
    t.add_column("phase", no_wrap=True)
    for q in shown:
        t.add_column(f"{QUANTITY_TITLES[q]}\nplan", justify="right")
        t.add_column("recorded", justify="right")
        if q == "allocated":
            t.add_column("plan - rec", justify="right")
    for row in rc.rows:
        cells = [row.phase + (" *" if row.note else "")]
        for q in shown:
            c = row.cell(q)
            cells += [_fig(c.planned), _fig(c.primary)]
            if q == "allocated":
                cells.append(_diff(c))
        t.add_row(*cells)
    console.print(t)
    hidden = [QUANTITY_TITLES[q] for q in QUANTITIES if q not in shown]
    if hidden:
        console.print(Text(f"not recorded, so not compared: {', '.join(hidden)} (the plan's figures are in --json)",
                           style="dim"))
    console.print(Text(LEGEND, style="dim"))
    for row in rc.rows:
        if row.note:
            console.print(Text(f"* {row.phase}: {row.note}", style="dim"))
    a = rc.attribution
    if a is not None:
        for p in a.phases:
            pt = Table(title=f"{p.phase}: what was live at its peak ({_gib(p.peak_bytes)} GiB requested), by ledger item "
                             f"(plan phase {p.plan_phase})", title_justify="left")
            for col in ("ledger item", "plan", "recorded", "plan - rec"):
                pt.add_column(col, justify="left" if col == "ledger item" else "right")
            for k in p.rows:
                pt.add_row(f"{k.name} [{', '.join(k.keys)}]" + ("" if k.exact else " (estimate)"),
                           f"{k.planned_bytes:,}" if k.planned_bytes is not None else "-", f"{k.recorded_bytes:,}",
                           f"{k.diff_bytes:+,}" if k.diff_bytes is not None else "")
            if p.unattributed_bytes:
                pt.add_row("no rule matched its frames (see below)", "-", f"{p.unattributed_bytes:,}", "")
            if p.before_trace_bytes:
                pt.add_row("allocated before the trace began", "-", f"{p.before_trace_bytes:,}", "")
            console.print(pt)
        if a.unplanned:
            ut = Table(title="Allocations the plan does not have (GPU)", title_justify="left")
            for col in ("where", "peak live (B)", "count", "phases", "stack (innermost first)"):
                ut.add_column(col)
            for u in a.unplanned:
                ut.add_row(u.where + (f" -> {', '.join(u.keys)}" if u.keys else ""), f"{u.peak_live_bytes:,}",
                           str(u.count), ", ".join(u.phases), " < ".join(u.stack[:3]))
            console.print(ut)
        if a.missing:
            mt = Table(title="Planned GPU items the recording never shows", title_justify="left")
            for col in ("ledger item", "planned (B)", "phases", "why"):
                mt.add_column(col)
            for m in a.missing:
                mt.add_row(f"{m.name} [{m.key}]", f"{m.planned_bytes:,}", ", ".join(m.phases), m.reason)
            console.print(mt)
        for nv in a.not_visible:
            console.print(Text(f"not visible to the caching allocator (not compared): {nv}", style="dim"))
    s = rc.simulator
    if s is not None:
        line = f"allocator simulator check (rank {s.rank}, device {s.device}, {s.events:,} events): {s.status}"
        if s.recorded_reserved_peak_bytes is not None:
            line += f"; recorded reserved peak {s.recorded_reserved_peak_bytes:,} B"
        if s.simulated_reserved_peak_bytes is not None:
            line += f", simulated {s.simulated_reserved_peak_bytes:,} B, {len(s.divergences)} divergence(s)"
        console.print(Text(line, style="bold"))
        if s.reason:
            console.print(Text(f"  {s.reason}", style="dim"))
        for d in s.divergences[:20]:
            console.print(Text(f"  {d}", style="red"))
    for n in rc.notes:
        console.print(Text(f"note: {n}", style="dim"))


# --------------------------------------------------------------------------- Markdown and HTML

def markdown_sections(rc: Reconciliation, chart_svg: str | None) -> str:
    lines = [f"## Plan vs recording: rank {rc.rank}", "", "| file | kind | provides | detail |", "|---|---|---|---|"]
    lines += [f"| `{r.path}` | {r.kind} | {', '.join(r.provides)} | {r.detail} |" for r in rc.records]
    head = "| phase | " + " | ".join(f"{QUANTITY_TITLES[q]} plan | recorded" for q in QUANTITIES) + " | alloc. plan - rec |"
    lines += ["", "GiB = 2^30 bytes; GPU per rank, pinned per process. " + LEGEND, "", head,
              "|---|" + "---:|" * (2 * len(QUANTITIES) + 1)]
    for row in rc.rows:
        cells = [f"{_fig(row.cell(q).planned)} | {_fig(row.cell(q).primary)}" for q in QUANTITIES]
        lines.append(f"| {row.phase}{' *' if row.note else ''} | " + " | ".join(cells) + f" | {_diff(row.allocated)} |")
    lines += [f"- \\* {row.phase}: {row.note}" for row in rc.rows if row.note]
    if chart_svg:
        data = base64.b64encode(chart_svg.encode()).decode()
        lines += ["", "### Memory over the run (the recording under the plan's step line)", "",
                  f"![memory over the run](data:image/svg+xml;base64,{data})"]
    a = rc.attribution
    if a is not None:
        for p in a.phases:
            lines += ["", f"### {p.phase}: live at its peak ({_gib(p.peak_bytes)} GiB requested), plan phase {p.plan_phase}", "",
                      "| ledger item | plan (B) | recorded (B) | plan - rec |", "|---|---:|---:|---:|"]
            for k in p.rows:
                lines.append(f"| {k.name} `{', '.join(k.keys)}`{'' if k.exact else ' (estimate)'} | "
                             f"{'-' if k.planned_bytes is None else f'{k.planned_bytes:,}'} | {k.recorded_bytes:,} | "
                             f"{'' if k.diff_bytes is None else f'{k.diff_bytes:+,}'} |")
            if p.unattributed_bytes:
                lines.append(f"| no rule matched its frames | - | {p.unattributed_bytes:,} | |")
        lines += ["", "### Allocations the plan does not have", ""]
        lines += [f"- `{u.where}`{' -> ' + ', '.join(u.keys) if u.keys else ''}: peak {u.peak_live_bytes:,} B live, "
                  f"{u.count} allocation(s), phases {', '.join(u.phases) or '-'}" for u in a.unplanned] or ["- none"]
        lines += ["", "### Planned GPU items the recording never shows", ""]
        lines += [f"- {m.name} `{m.key}`: {m.planned_bytes:,} B planned in {', '.join(m.phases)}: {m.reason}"
                  for m in a.missing] or ["- none"]
    s = rc.simulator
    if s is not None:
        lines += ["", "### Allocator simulator check", "", f"- status: **{s.status}** ({s.events:,} events, device {s.device})"]
        if s.recorded_reserved_peak_bytes is not None:
            lines.append(f"- recorded reserved peak: {s.recorded_reserved_peak_bytes:,} B")
        if s.simulated_reserved_peak_bytes is not None:
            lines.append(f"- simulated reserved peak: {s.simulated_reserved_peak_bytes:,} B; {len(s.divergences)} divergence(s)")
        if s.reason:
            lines.append(f"- {s.reason}")
    if rc.notes:
        lines += ["", "### Notes", ""] + [f"- {n}" for n in rc.notes]
    return "\n".join(lines) + "\n"


def _td(text: str, cls: str = "") -> str:
    return f"<td{' class=' + cls if cls else ''}>{escape(text)}</td>"


def html_sections(rc: Reconciliation) -> tuple[tuple[str, str], ...]:
    recs = "".join(f"<tr>{_td(r.path)}{_td(r.kind)}{_td(', '.join(r.provides))}{_td(r.detail)}</tr>" for r in rc.records)
    head = "".join(f"<th>{escape(QUANTITY_TITLES[q])}<br>plan</th><th>recorded</th>" for q in QUANTITIES)
    body = []
    for row in rc.rows:
        cells = "".join(_td(_fig(row.cell(q).planned), "n") + _td(_fig(row.cell(q).primary), "n") for q in QUANTITIES)
        title = f' title="{escape(row.note)}"' if row.note else ""
        body.append(f"<tr><td{title}>{escape(row.phase)}{' *' if row.note else ''}</td>{cells}{_td(_diff(row.allocated), 'n')}</tr>")
    notes = "".join(f"<li>{escape(row.phase)}: {escape(row.note)}</li>" for row in rc.rows if row.note)
    table = (f"<table><tr><th>file</th><th>kind</th><th>provides</th><th>detail</th></tr>{recs}</table>"
             f"<p><small>GiB = 2<sup>30</sup> bytes; GPU per rank, pinned per process. {escape(LEGEND)}</small></p>"
             f'<table id="compare-table"><tr><th>phase</th>{head}<th>allocated<br>plan - rec</th></tr>{"".join(body)}</table>'
             f"<ul>{notes}</ul>")
    sections = [(f"Plan vs recording: rank {rc.rank}", table)]
    a = rc.attribution
    if a is not None:
        parts = []
        for p in a.phases:
            rows = "".join(
                f"<tr>{_td(k.name + ' [' + ', '.join(k.keys) + ']' + ('' if k.exact else ' (estimate)'))}"
                f"{_td('-' if k.planned_bytes is None else f'{k.planned_bytes:,}', 'n')}{_td(f'{k.recorded_bytes:,}', 'n')}"
                f"{_td('' if k.diff_bytes is None else f'{k.diff_bytes:+,}', 'n')}</tr>" for k in p.rows)
            if p.unattributed_bytes:
                rows += f"<tr>{_td('no rule matched its frames')}{_td('-')}{_td(f'{p.unattributed_bytes:,}', 'n')}{_td('')}</tr>"
            parts.append(f"<h3>{escape(p.phase)}: live at its peak ({_gib(p.peak_bytes)} GiB requested), plan phase "
                         f"{escape(str(p.plan_phase))}</h3><table><tr><th>ledger item</th><th>plan (B)</th><th>recorded (B)</th>"
                         f"<th>plan - rec</th></tr>{rows}</table>")
        unplanned = "".join(f"<li><code>{escape(u.where)}</code>{escape(' -> ' + ', '.join(u.keys)) if u.keys else ''}: peak "
                            f"{u.peak_live_bytes:,} B live, {u.count} allocation(s), phases {escape(', '.join(u.phases) or '-')}"
                            f"<br><small>{escape(' < '.join(u.stack))}</small></li>" for u in a.unplanned) or "<li>none</li>"
        missing = "".join(f"<li>{escape(m.name)} <code>{escape(m.key)}</code>: {m.planned_bytes:,} B planned in "
                          f"{escape(', '.join(m.phases))}: {escape(m.reason)}</li>" for m in a.missing) or "<li>none</li>"
        invisible = "".join(f"<li>{escape(n)}</li>" for n in a.not_visible)
        parts.append(f'<h3>Allocations the plan does not have</h3><ul id="unplanned">{unplanned}</ul>'
                     f'<h3>Planned GPU items the recording never shows</h3><ul id="missing">{missing}</ul>'
                     + (f"<h3>Not visible to the caching allocator (not compared)</h3><ul>{invisible}</ul>" if invisible else ""))
        sections.append(("What the snapshot's allocations were, by ledger item", "".join(parts)))
    s = rc.simulator
    if s is not None:
        items = [f"status: <b>{escape(s.status)}</b> ({s.events:,} events, device {s.device})"]
        if s.recorded_reserved_peak_bytes is not None:
            items.append(f"recorded reserved peak: {s.recorded_reserved_peak_bytes:,} B")
        if s.simulated_reserved_peak_bytes is not None:
            items.append(f"simulated reserved peak: {s.simulated_reserved_peak_bytes:,} B; {len(s.divergences)} divergence(s)")
        if s.reason:
            items.append(escape(s.reason))
        items += [escape(d) for d in s.divergences[:50]]
        sections.append(("Allocator simulator check", "<ul>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>"))
    if rc.notes:
        sections.append(("Notes on the records", "<ul>" + "".join(f"<li>{escape(n)}</li>" for n in rc.notes) + "</ul>"))
    return tuple(sections)
