"""Inline SVG charts of a plan: memory per phase, stacked by category, with the capacity line.

Presentation only: the bars are the ledger items live at each phase's peak, grouped by category.
"""

from __future__ import annotations

from html import escape

from memfit.core.ledger_types import Device, PhaseLedger, Plan

GiB = 2**30
COLORS = {
    "params": "#4e79a7", "grads": "#f28e2b", "optimizer": "#e15759", "buffers": "#76b7b2",
    "activations": "#59a14f", "runtime": "#bab0ac", "other": "#9c755f",
}
HOST = (Device.CPU_PINNED, Device.CPU_PAGEABLE)


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


def phase_chart_svg(plan: Plan, device: str, capacity_bytes: int, title: str) -> str:
    """A stacked bar per phase (GiB) and a dashed capacity line."""
    width, height, left, bottom, top = 760, 300, 60, 70, 30
    n = len(plan.phases)
    data = [stacks(ph, device) for ph in plan.phases]
    peak = max([sum(d.values()) for d in data] + [capacity_bytes]) * 1.08
    plot_h = height - bottom - top
    bar_w = (width - left - 20) / n * 0.7
    step = (width - left - 20) / n

    def y(b: float) -> float:
        return top + plot_h - plot_h * b / peak

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="{escape(title)}" font-family="sans-serif" font-size="11">',
             f'<text x="{left}" y="16" font-size="13" font-weight="bold">{escape(title)}</text>']
    for k in range(0, 6):  # axis ticks in GiB
        v = peak * k / 5
        parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#eee"/>'
                     f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v / GiB:.1f}</text>')
    parts.append(f'<text x="14" y="{top + plot_h / 2}" transform="rotate(-90 14 {top + plot_h / 2})" '
                 f'text-anchor="middle">GiB</text>')
    for i, (ph, d) in enumerate(zip(plan.phases, data)):
        x = left + i * step + (step - bar_w) / 2
        acc = 0
        for cat in COLORS:
            b = d.get(cat, 0)
            if not b:
                continue
            parts.append(f'<rect x="{x:.1f}" y="{y(acc + b):.1f}" width="{bar_w:.1f}" height="{y(acc) - y(acc + b):.1f}" '
                         f'fill="{COLORS[cat]}"><title>{escape(ph.name)}: {escape(cat)} {b / GiB:.2f} GiB</title></rect>')
            acc += b
        parts.append(f'<text x="{x + bar_w / 2:.1f}" y="{height - bottom + 14}" text-anchor="end" '
                     f'transform="rotate(-35 {x + bar_w / 2:.1f} {height - bottom + 14})">{escape(ph.name)}</text>')
    cy = y(capacity_bytes)
    parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{cy:.1f}" y2="{cy:.1f}" stroke="#c00" stroke-dasharray="6 4" stroke-width="2"/>'
                 f'<text x="{width - 12}" y="{cy - 5:.1f}" text-anchor="end" fill="#c00">capacity {capacity_bytes / GiB:.2f} GiB</text>')
    lx = left
    for cat, color in COLORS.items():
        parts.append(f'<rect x="{lx}" y="{height - 14}" width="10" height="10" fill="{color}"/>'
                     f'<text x="{lx + 14}" y="{height - 5}">{cat}</text>')
        lx += 95
    parts.append("</svg>")
    return "".join(parts)


SERIES_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2")


def timeline_chart_svg(tl, title: str) -> str:
    """The recording over time on the phase axis (``memfit.core.compare.types.Timeline``): one column
    per recorded phase occurrence, the plan's tensor bytes as a dashed step line, the recorded curves
    (snapshot trace, memory_stats peaks, nvidia-smi samples) over it, and the capacity line."""
    width, height, left, bottom, top, right = 760, 370, 60, 125, 30, 20
    n = max(len(tl.phases), 1)
    values = [p.bytes for s in (tl.plan, *tl.recorded) for p in s.points]
    peak = max(values + [tl.capacity_bytes or 0, 1]) * 1.08
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
    if tl.capacity_bytes:
        cy = y(tl.capacity_bytes)
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{cy:.1f}" y2="{cy:.1f}" stroke="#c00" stroke-dasharray="6 4" '
                     f'stroke-width="2"/><text x="{width - right - 2}" y="{cy - 5:.1f}" text-anchor="end" fill="#c00">'
                     f'capacity {tl.capacity_bytes / GiB:.2f} GiB</text>')
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
