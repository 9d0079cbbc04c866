"""memfit's measured error on the published runs: the accuracy table and the verdict's margins.

``accuracy_table(comparisons)`` sums up ``compare_public_run`` over a corpus: per figure kind
(allocated, reserved, nvidia-smi, host) and per framework, the median and the worst error like for
like, and how often the verdict agrees with the run's outcome.

``derive_margins(comparisons)`` turns the same errors into the verdict's margins
(``core/verdict.py``): for the GPU, memfit's shortfalls on the figures a CUDA OOM depends on
(reserved and nvidia-smi: what the card holds, not what tensors hold); for the host, its shortfalls on
host figures. A shortfall is ``measured / planned - 1`` where memfit said less, 0 where it said as
much or more. The margin is the ``MARGIN_QUANTILE`` quantile of the shortfalls (nearest rank): a run
whose plan leaves that much headroom was, in at least that share of the published runs, still
within it. Fewer than ``MIN_FIGURES`` figures give no margin (0) and say so.
"""

from __future__ import annotations

import math
from statistics import median

from memfit.core.lean_dataclass import dataclass
from memfit.core.compare.public_run import CaseComparison

FIGURE_KINDS = ("allocated", "reserved", "nvidia-smi", "host")
GPU_MARGIN_KINDS = ("reserved", "nvidia-smi")
MARGIN_QUANTILE = 0.75
"""The share of published shortfalls a margin covers: three in four. Higher quantiles cover the
cases memfit models worst (a known gap each, see the corpus's ``memfit_gaps``) and would make "at
risk" of runs that were far from their limit."""
MIN_FIGURES = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorRow:
    group: str
    figures: int
    cases: int
    median_abs: float
    """Median of |error|."""
    median: float
    """Median of the signed error (negative: memfit says less than the run used)."""
    worst: float
    """The signed error of largest magnitude."""
    worst_case: str
    low: int
    """Figures where memfit says less than measured."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AccuracyTable:
    by_kind: tuple[ErrorRow, ...]
    by_framework: tuple[ErrorRow, ...]
    """GPU figures only (allocated, reserved, nvidia-smi), per planned framework."""
    gpu: ErrorRow | None
    """Every GPU figure together."""
    cases: int
    planned: int
    agree: int
    at_risk: int
    disagreements: tuple[tuple[str, str], ...]
    """(case id, why) of every verdict that disagrees."""
    refused: tuple[tuple[str, str], ...]
    """(case id, memfit's one-line refusal) of cases memfit could not plan."""


def _row(group: str, pairs: list[tuple[str, float]]) -> ErrorRow | None:
    if not pairs:
        return None
    errs = [e for _, e in pairs]
    worst_id, worst = max(pairs, key=lambda p: abs(p[1]))
    return ErrorRow(group=group, figures=len(errs), cases=len({c for c, _ in pairs}),
                    median_abs=median(abs(e) for e in errs), median=median(errs), worst=worst, worst_case=worst_id,
                    low=sum(e < 0 for e in errs))


def figure_errors(comparisons: tuple[CaseComparison, ...]) -> list[tuple[str, str, str, float]]:
    """(case id, framework, figure kind, error) of every figure compared."""
    out = []
    for c in comparisons:
        if c.error:
            continue
        for f in c.figures:
            if f.error is not None and f.measurement.figure_kind:
                out.append((c.case.id, c.framework, f.measurement.figure_kind, f.error))
    return out


def accuracy_table(comparisons: tuple[CaseComparison, ...]) -> AccuracyTable:
    errs = figure_errors(comparisons)
    by_kind = [r for k in FIGURE_KINDS if (r := _row(k, [(c, e) for c, _, kk, e in errs if kk == k]))]
    gpu = [(c, fw, e) for c, fw, k, e in errs if k != "host"]
    fws = sorted({fw for _, fw, _ in gpu})
    by_fw = [r for fw in fws if (r := _row(fw, [(c, e) for c, f, e in gpu if f == fw]))]
    planned = [c for c in comparisons if not c.error]
    return AccuracyTable(
        by_kind=tuple(by_kind), by_framework=tuple(by_fw), gpu=_row("GPU (all)", [(c, e) for c, _, e in gpu]),
        cases=len(comparisons), planned=len(planned), agree=sum(c.agrees for c in planned),
        at_risk=sum(c.level == "at_risk" for c in planned),
        disagreements=tuple((c.case.id, c.why) for c in planned if not c.agrees),
        refused=tuple((c.case.id, c.error) for c in comparisons if c.error))


def _quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile (the smallest value with at least q of the values at or below it)."""
    s = sorted(values)
    return s[max(math.ceil(q * len(s)) - 1, 0)]


def shortfalls(comparisons: tuple[CaseComparison, ...], kinds: tuple[str, ...]) -> list[float]:
    """``measured / planned - 1`` where memfit said less (else 0), for the figures of ``kinds``."""
    out = []
    for c in comparisons:
        if c.error:
            continue
        for f in c.figures:
            if f.error is None or f.measurement.figure_kind not in kinds or not f.planned_bytes:
                continue
            out.append(max(f.measurement.bytes / f.planned_bytes - 1.0, 0.0))
    return out


def derive_margins(comparisons: tuple[CaseComparison, ...]) -> dict:
    """The verdict's margins from the corpus (see the module docstring), as ``verdict_margin.json``
    holds them."""
    out: dict = {}
    for name, kinds in (("gpu", GPU_MARGIN_KINDS), ("host", ("host",))):
        s = shortfalls(comparisons, kinds)
        margin = round(_quantile(s, MARGIN_QUANTILE), 3) if len(s) >= MIN_FIGURES else 0.0
        out[name] = {"margin": margin, "quantile": MARGIN_QUANTILE, "figures": len(s),
                     "kinds": list(kinds), "short": sum(x > 0 for x in s),
                     "rule": (f"the {MARGIN_QUANTILE:.0%} quantile of memfit's shortfalls (measured / planned - 1, "
                              "0 where it said as much or more)" if len(s) >= MIN_FIGURES else
                              f"fewer than {MIN_FIGURES} figures: no margin")}
    n = len([c for c in comparisons if not c.error])
    out["source"] = (f"memfit's shortfalls on {out['gpu']['figures']} GPU (reserved, nvidia-smi) and "
                     f"{out['host']['figures']} host figures of {n} published, measured runs "
                     "(tests/fixtures/public_runs; benchmarks/accuracy.py)")
    return out
