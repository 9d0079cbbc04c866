"""The plan's first screen: the verdict and its figures, named as everywhere (``memfit.core.figures``),
then the few findings that matter, in lines short enough for 80 columns. The terminal prints it
before the tables; the reports use the same sentences. Nothing here computes a figure."""

from __future__ import annotations

from memfit.core.figures import VERDICT_TAG, Figure, Headline, headline
from memfit.core.ledger_types import Plan
from memfit.core.units import fmt_bytes

MAX_FINDINGS = 3
"""Findings shown on the first screen (errors first); the rest follow the tables."""


_VDEV = {"gpu": "GPU memory (per rank)", "cpu": "host RAM (per node)", "nvme": "NVMe"}


def verdict_lines(plan: Plan) -> tuple[tuple[str, str], ...]:
    """The verdict in words, as (text, style) lines: the level, then the first and the worst failure
    (or every risk), then the margins it used. The terminal and the reports print the same lines;
    the figure compared is named as everywhere (``memfit.core.figures``), its definition printed
    under the phase table."""
    from memfit.core.figures import HOST_NODE, VERDICT_TAG, failure_figure_name, gpu_verdict_name

    v = plan.verdict
    margins = (f"margins: {v.gpu_margin:.0%} of the GPU figure and {v.host_margin:.0%} of the host figure "
               f"(memfit's measured error: {v.margin_source or 'see verdict_margin.json'}), "
               f"{fmt_bytes(v.host_reserve_bytes, 'GB')} of host RAM kept for the OS"
               + ("; the card is shared with other processes (--shared-gpu)" if v.shared_gpu else ""))
    if v.level == "does_not_fit":
        f = v.failures[0]
        out = [(f"DOES NOT FIT: phase {f.phase} needs {fmt_bytes(f.needed_bytes)} of {_VDEV[f.device]} "
                f"({failure_figure_name(plan, f)}, {VERDICT_TAG}), {fmt_bytes(f.available_bytes)} available "
                f"({fmt_bytes(f.needed_bytes - f.available_bytes)} short).", "bold red")]
        w = v.worst
        if w is not None and w is not f:
            out.append((f"Worst: phase {w.phase} needs {fmt_bytes(w.needed_bytes)} of {_VDEV[w.device]}, "
                        f"{w.needed_bytes / w.available_bytes:.0%} of the {fmt_bytes(w.available_bytes)} available "
                        f"({len(v.failures)} phase/device failures in all).", "red"))
        return tuple(out)
    compared = f" (compared: {gpu_verdict_name(plan)} and {HOST_NODE}, {VERDICT_TAG}s)" if v.gpu_figure else ""
    if v.level == "at_risk":
        out = [("AT RISK: every phase fits on paper, but within memfit's margin of a limit" + compared + ".",
                "bold yellow")]
        for dev in ("gpu", "cpu"):
            mine = [r for r in v.risks if r.device == dev]
            if not mine:
                continue
            r = max(mine, key=lambda r: r.needed_bytes)
            more = f" ({len(mine) - 1} other phase(s) too)" if len(mine) > 1 else ""
            out.append((f"  phase {r.phase}: {fmt_bytes(r.needed_bytes)} of {fmt_bytes(r.available_bytes)} "
                        f"{_VDEV[r.device]} ({r.needed_bytes / r.available_bytes:.0%}); fits needs <= "
                        f"{fmt_bytes(r.limit_bytes)}: {r.why}{more}", "yellow"))
        return (*out, (margins, "dim"))
    return (("FITS: every phase stays within GPU and host memory, with memfit's margin to spare" + compared + ".",
             "bold green"), (margins, "dim"))


def verdict_sentence(plan: Plan) -> str:
    """The verdict's first line as the terminal prints it (``verdict_lines``: ``FITS ...``, ``AT
    RISK ...`` or ``DOES NOT FIT: phase P needs X of DEVICE (FIGURE, the verdict's figure), Y
    available (Z short).``), for the outputs that say it in one sentence."""
    return verdict_lines(plan)[0][0]


def figure_line(fig: Figure, capacity_bytes: int | None) -> str:
    """``GPU OOM-relevant peak: 12.77 GiB of 23.65 GiB per rank (54%), in step2.forward``."""
    cap = f" of {fmt_bytes(capacity_bytes)}" if capacity_bytes else ""
    pct = f" ({fig.bytes / capacity_bytes:.0%})" if capacity_bytes else ""
    return f"{fig.name}: {fmt_bytes(fig.bytes)}{cap} {fig.scope}{pct}, in {fig.phase}"


def companions_line(figs: tuple[Figure, ...]) -> str:
    return "; ".join(f"{f.name} {fmt_bytes(f.bytes)} ({f.phase})" for f in figs)


def headline_lines(h: Headline, gpu_capacity: int | None, host_capacity: int | None) -> list[str]:
    """The verdict's two figures (marked as such) and their companions, one line each."""
    out = [f"{figure_line(h.gpu, gpu_capacity)} ({VERDICT_TAG})"]
    if h.gpu_companions:
        out.append("  also: " + companions_line(h.gpu_companions))
    out.append(f"{figure_line(h.host, host_capacity)} ({VERDICT_TAG})")
    if h.host_companions:
        out.append("  also: " + companions_line(h.host_companions))
    return out


def summary(plan: Plan, gpu_capacity: int | None, host_capacity: int | None) -> tuple[str, list[str], list[tuple[str, str]]]:
    """(verdict sentence, figure lines, first findings as (severity, message))."""
    found = sorted((f for f in plan.findings if f.severity in ("error", "warning")),
                   key=lambda f: f.severity != "error")
    return (verdict_sentence(plan), headline_lines(headline(plan), gpu_capacity, host_capacity),
            [(f.severity, first_sentence(f.message)) for f in found[:MAX_FINDINGS]])


def first_sentence(text: str) -> str:
    """A finding's first sentence (the whole message follows the tables)."""
    cut = text.find(". ")
    return text if cut < 0 else text[:cut + 1] + " (more below)"
