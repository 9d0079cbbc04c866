"""Inline SVG charts of a plan: memory per phase, stacked by category, with the capacity line.

Presentation only: each bar is the ledger items live at the phase's peak, grouped by category, topped
by the allocator's share (block rounding, cached and stranded segments: the verdict's figure minus
the items), so a bar's height is the verdict's figure for that phase (``memfit.core.figures``), the
figure the page's headline names. The phase that fails first is outlined and labelled. The legend
sits above the plot, where no bar or label reaches.
"""

from __future__ import annotations

from html import escape

from memfit.core.figures import gpu_verdict_bytes, host_verdict_bytes
from memfit.core.ledger_types import Device, PhaseLedger, Plan

GiB = 2**30
COLORS = {
    "params": "#4e79a7", "grads": "#f28e2b", "optimizer": "#e15759", "buffers": "#76b7b2",
    "activations": "#59a14f", "runtime": "#bab0ac", "other": "#9c755f", "allocator": "#d4a6c8",
}
LABELS = {"allocator": "allocator (rounding, cached segments)"}
HOST = (Device.CPU_PINNED, Device.CPU_PAGEABLE)
LABEL_PX_PER_CHAR = 6.3
"""Width of a character of the 11 px sans-serif labels, to size the room the rotated phase names need."""


def stacks(ph: PhaseLedger, device: str) -> dict[str, int]:
    """Bytes by category at the phase's peak: ``gpu`` per rank, ``host`` per node."""
    out: dict[str, int] = {}
    for it in ph.items:
        if device == "gpu" and it.device is Device.GPU:
            b = it.bytes
        elif device == "host" and it.device in HOST:
            b = it.bytes if it.rank0_only else it.bytes * ph.ranks_per_node
        else:
            continue
        out[it.category] = out.get(it.category, 0) + b
    return out


def verdict_bytes(ph: PhaseLedger, device: str) -> int:
    return gpu_verdict_bytes(ph) if device == "gpu" else host_verdict_bytes(ph)


def bar_segments(ph: PhaseLedger, device: str) -> dict[str, int]:
    """``stacks`` plus the allocator's share, so the segments add up to the verdict's figure."""
    out = stacks(ph, device)
    extra = verdict_bytes(ph, device) - sum(out.values())
    if extra > 0:
        out["allocator"] = extra
    return out


def _legend(parts: list[str], entries: list[tuple[str, str]], x0: int, y: int, right: int) -> int:
    """One or more rows of legend entries from ``x0``; returns the y under the last row."""
    lx, ly = x0, y
    for label, color in entries:
        w = 18 + int(LABEL_PX_PER_CHAR * len(label))
        if lx + w > right and lx > x0:
            lx, ly = x0, ly + 15
        parts.append(f'<g class="legend"><rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{color}"/>'
                     f'<text x="{lx + 14}" y="{ly}">{escape(label)}</text></g>')
        lx += w + 10
    return ly + 8


def phase_chart_svg(plan: Plan, device: str, capacity_bytes: int, title: str) -> str:
    """A stacked bar per phase (GiB) up to the verdict's figure, the capacity line, the failing phase
    marked."""
    fails = {f.phase: f for f in plan.verdict.failures if f.device == device}
    first = plan.verdict.failures[0].phase if plan.verdict.failures else None
    return grouped_chart_svg([(None, plan)], device, capacity_bytes, title, stacked=True,
                             failing={first} & set(fails) if first in fails else set(fails))


def grouped_chart_svg(plans: list[tuple[str | None, Plan]], device: str, capacity_bytes: int, title: str, *,
                      stacked: bool = False, failing: set[str] | None = None) -> str:
    """Bars per phase for one plan (stacked by category) or several side by side (the verdict's figure,
    one colour per plan: the user's configuration beside a recommended one)."""
    width = 760
    names = [p.name for p in plans[0][1].phases]
    n = len(names)
    label_room = int(max(len(nm) for nm in names) * LABEL_PX_PER_CHAR * 0.58) + 22  # sin(35 deg) of the longest
    parts = [f'<text x="60" y="16" font-size="13" font-weight="bold">{escape(title)}</text>']
    entries = ([(LABELS.get(c, c), col) for c, col in COLORS.items()] if stacked else
               [(label or "plan", col) for (label, _), col in zip(plans, PLAN_COLORS)])
    top = _legend(parts, entries, 60, 34, width - 10) + 14
    plot_h = 200
    height = top + plot_h + label_room
    left = 60
    data = [[bar_segments(ph, device) if stacked else {"total": verdict_bytes(ph, device)} for ph in plan.phases]
            for _, plan in plans]
    peak = max([sum(d.values()) for rows in data for d in rows] + [capacity_bytes]) * 1.08
    step = (width - left - 20) / n
    group_w = step * 0.7
    bar_w = group_w / len(plans)

    def y(b: float) -> float:
        return top + plot_h - plot_h * b / peak

    for k in range(0, 6):  # axis ticks in GiB
        v = peak * k / 5
        parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#eee"/>'
                     f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v / GiB:.1f}</text>')
    parts.append(f'<text x="14" y="{top + plot_h / 2}" transform="rotate(-90 14 {top + plot_h / 2})" '
                 f'text-anchor="middle">GiB</text>')
    for i, name in enumerate(names):
        gx = left + i * step + (step - group_w) / 2
        for j, ((label, plan), rows) in enumerate(zip(plans, data)):
            x = gx + j * bar_w
            acc = 0
            for cat, b in (rows[i].items() if not stacked else ((c, rows[i].get(c, 0)) for c in COLORS)):
                if not b:
                    continue
                color = COLORS[cat] if stacked else PLAN_COLORS[j]
                what = f"{escape(cat)} " if stacked else (f"{escape(label)}: " if label else "")
                parts.append(f'<rect class="bar" x="{x:.1f}" y="{y(acc + b):.1f}" width="{bar_w:.1f}" '
                             f'height="{y(acc) - y(acc + b):.1f}" fill="{color}"><title>{escape(name)}: {what}'
                             f'{b / GiB:.2f} GiB</title></rect>')
                acc += b
            parts.append(f'<rect class="bar-total" data-phase="{escape(name)}" data-plan="{j}" data-bytes="{acc}" '
                         f'x="{x:.1f}" y="{y(acc):.1f}" width="{bar_w:.1f}" height="{y(0) - y(acc):.1f}" fill="none"'
                         + (' stroke="#c00" stroke-width="2.5"' if failing and name in failing and j == 0 else "")
                         + f'><title>{escape(name)}: {acc / GiB:.2f} GiB ({acc:,} B)</title></rect>')
        if failing and name in failing:
            parts.append(f'<text class="fails" x="{gx + group_w / 2:.1f}" y="{max(y(sum(data[0][i].values())) - 4, top - 2):.1f}" '
                         f'text-anchor="middle" fill="#c00" font-weight="bold">fails</text>')
        lx = gx + group_w / 2
        parts.append(f'<text class="phase-label" x="{lx:.1f}" y="{top + plot_h + 14}" text-anchor="end" '
                     f'transform="rotate(-35 {lx:.1f} {top + plot_h + 14})">{escape(name)}</text>')
    cy = y(capacity_bytes)
    parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{cy:.1f}" y2="{cy:.1f}" stroke="#c00" stroke-dasharray="6 4" stroke-width="2"/>'
                 f'<text x="{width - 12}" y="{cy - 5:.1f}" text-anchor="end" fill="#c00">capacity {capacity_bytes / GiB:.2f} GiB</text>')
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
            f'aria-label="{escape(title)}" font-family="sans-serif" font-size="11">')
    return head + "".join(parts) + "</svg>"


PLAN_COLORS = ("#8a8a8a", "#2b7bb9", "#59a14f", "#e15759")
"""Side-by-side bars: the user's configuration (grey), then each recommended one."""


CAPACITY_ON_SCALE = 1.5
"""A recording's chart shows the capacity line only when it is at most this many times the highest
figure drawn; above that it is named instead, so a small recording is not drawn flat."""
SERIES_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2")


def timeline_chart_svg(tl, title: str) -> str:
    """The recording over time on the phase axis (``memfit.core.compare.types.Timeline``): one column
    per recorded phase occurrence, the plan's tensor bytes as a dashed step line, the recorded curves
    (snapshot trace, memory_stats peaks, nvidia-smi samples) over it, and the capacity line."""
    width, height, left, bottom, top, right = 760, 370, 60, 125, 30, 20
    n = max(len(tl.phases), 1)
    values = [p.bytes for s in (tl.plan, *tl.recorded) for p in s.points]
    highest = max(values + [1])
    # scaled to the recording and the plan: the capacity line only when it is on that scale
    on_chart = bool(tl.capacity_bytes) and tl.capacity_bytes <= CAPACITY_ON_SCALE * highest
    peak = max(highest, tl.capacity_bytes if on_chart else 0) * 1.08
    plot_w, plot_h = width - left - right, height - bottom - top

    def x(v: float) -> float:
        return left + plot_w * v / n

    def y(b: float) -> float:
        return top + plot_h - plot_h * b / peak

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="{escape(title)}" font-family="sans-serif" font-size="11">',
             f'<text x="{left}" y="16" font-size="13" font-weight="bold">{escape(title)}</text>']
    for k in range(0, 6):
        v = peak * k / 5
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#eee"/>'
                     f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v / GiB:.1f}</text>')
    parts.append(f'<text x="14" y="{top + plot_h / 2}" transform="rotate(-90 14 {top + plot_h / 2})" '
                 f'text-anchor="middle">GiB</text>')
    for i, name in enumerate(tl.phases):
        cx = x(i + 0.5)
        parts.append(f'<line x1="{x(i):.1f}" x2="{x(i):.1f}" y1="{top}" y2="{top + plot_h}" stroke="#ddd"/>'
                     f'<text x="{cx:.1f}" y="{height - bottom + 14}" text-anchor="end" '
                     f'transform="rotate(-35 {cx:.1f} {height - bottom + 14})">{escape(name)}</text>')

    def path(points) -> str:
        return " ".join(f"{'M' if j == 0 else 'L'}{x(p.x):.1f},{y(p.bytes):.1f}" for j, p in enumerate(points))

    def steps(points) -> str:
        out = []
        for j in range(0, len(points) - 1, 2):
            a, b = points[j], points[j + 1]
            out.append(f"M{x(a.x):.1f},{y(a.bytes):.1f} L{x(b.x):.1f},{y(b.bytes):.1f}")
        return " ".join(out)

    parts.append(f'<path d="{steps(tl.plan.points)}" fill="none" stroke="#222" stroke-width="2.5" stroke-dasharray="7 4">'
                 f'<title>{escape(tl.plan.label)}</title></path>')
    legend = [(tl.plan.label, "#222", "dash")]
    for s, color in zip(tl.recorded, SERIES_COLORS):
        if s.style == "dots":
            parts.extend(f'<circle cx="{x(p.x):.1f}" cy="{y(p.bytes):.1f}" r="2.2" fill="{color}"/>' for p in s.points)
        else:
            d = steps(s.points) if s.style == "step" else path(s.points)
            parts.append(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="1.6"><title>{escape(s.label)}</title></path>')
        legend.append((s.label, color, s.style))
    if on_chart:
        cy = y(tl.capacity_bytes)
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{cy:.1f}" y2="{cy:.1f}" stroke="#c00" stroke-dasharray="6 4" '
                     f'stroke-width="2"/><text x="{width - right - 2}" y="{cy - 5:.1f}" text-anchor="end" fill="#c00">'
                     f'capacity {tl.capacity_bytes / GiB:.2f} GiB</text>')
    elif tl.capacity_bytes:
        parts.append(f'<text x="{width - right - 2}" y="{top + 12}" text-anchor="end" fill="#c00">capacity '
                     f'{tl.capacity_bytes / GiB:.2f} GiB: above this chart</text>')
    lx, ly = left, height - 34
    for label, color, style in legend:
        dash = ' stroke-dasharray="7 4"' if style == "dash" else ""
        parts.append(f'<line x1="{lx}" x2="{lx + 18}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2.5"{dash}/>'
                     f'<text x="{lx + 22}" y="{ly + 4}">{escape(label)}</text>')
        lx += 34 + int(6.3 * len(label))
        if lx > width - 230:
            lx, ly = left, ly + 14
    parts.append("</svg>")
    return "".join(parts)
