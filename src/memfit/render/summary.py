"""The plan's first screen: the verdict and its figures, named as everywhere (``memfit.core.figures``),
then the few findings that matter, in lines short enough for 80 columns. The terminal prints it
before the tables; the reports use the same sentences. Nothing here computes a figure."""

from __future__ import annotations

from memfit.core.figures import VERDICT_TAG, Figure, Headline, headline
from memfit.core.ledger_types import Plan
from memfit.core.units import fmt_bytes

MAX_FINDINGS = 3
"""Findings shown on the first screen (errors first); the rest follow the tables."""


def verdict_sentence(plan: Plan) -> str:
    """The verdict's first line as the terminal prints it (``terminal.verdict_lines``: ``FITS ...``,
    ``AT RISK ...`` or ``DOES NOT FIT: phase P needs X of DEVICE (FIGURE, the verdict's figure), Y
    available (Z short).``), for the outputs that say it in one sentence."""
    from memfit.render.terminal import verdict_lines

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
