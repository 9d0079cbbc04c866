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
