"""memfit against the published, measured GPU runs of tests/fixtures/public_runs/ (issue 19 item 6).

Prints, like for like (allocated with allocated, reserved with reserved, nvidia-smi with nvidia-smi,
host RSS with host): the median and worst error per figure kind and per framework, the verdict
agreement with the runs' outcomes, every disagreement with its reason, the cases memfit refuses,
and the margins the verdict derives from these errors (core/compare/accuracy.py:derive_margins).

    python benchmarks/accuracy.py                  # the table
    python benchmarks/accuracy.py --cases          # and every figure of every case
    python benchmarks/accuracy.py --write-margin   # rewrite src/memfit/core/verdict_margin.json
    python benchmarks/accuracy.py --write-baseline # rewrite tests/fixtures/accuracy/baseline.json

The baseline is what tests/core/test_public_runs.py holds every case to (its error may not grow);
rewrite it only when a change makes cases better, and say so in the commit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "fixtures" / "public_runs"
BASELINE = ROOT / "tests" / "fixtures" / "accuracy" / "baseline.json"


def run_corpus():
    from memfit.core.compare.public_run import compare_public_run
    from memfit.core.records.public_run import read_corpus

    return tuple(compare_public_run(c) for c in read_corpus(CORPUS))


def baseline(comparisons) -> dict:
    """Per case: each figure's error (rounded to 0.1%) and whether the verdict agrees."""
    out = {}
    for c in comparisons:
        out[c.case.id] = {
            "planned": not c.error, "agrees": c.agrees, "level": c.level,
            "errors": [None if f.error is None else round(f.error, 3) for f in c.figures],
        }
    return out


def _pct(x: float) -> str:
    return f"{x:+.1%}"


def print_table(comparisons, *, cases: bool) -> None:
    from memfit.core.compare.accuracy import accuracy_table, derive_margins

    t = accuracy_table(comparisons)
    print(f"{t.cases} cases, {t.planned} planned, {len(t.refused)} refused by memfit")
    print()
    print(f"{'figure kind':<14}{'figures':>8}{'cases':>7}{'median |err|':>14}{'median':>9}{'worst':>9}  {'low':>4}  worst case")
    for r in (*t.by_kind, *((t.gpu,) if t.gpu else ())):
        print(f"{r.group:<14}{r.figures:>8}{r.cases:>7}{r.median_abs:>14.1%}{_pct(r.median):>9}{_pct(r.worst):>9}"
              f"  {r.low:>4}  {r.worst_case}")
    print()
    print(f"{'framework (GPU)':<16}{'figures':>8}{'cases':>7}{'median |err|':>14}{'median':>9}{'worst':>9}  {'low':>4}")
    for r in t.by_framework:
        print(f"{r.group:<16}{r.figures:>8}{r.cases:>7}{r.median_abs:>14.1%}{_pct(r.median):>9}{_pct(r.worst):>9}  {r.low:>4}")
    print()
    print(f"verdict agrees with the run's outcome in {t.agree} of {t.planned} planned cases "
          f"({t.agree / max(t.planned, 1):.0%}); 'at risk' in {t.at_risk}")
    for cid, why in t.disagreements:
        print(f"  disagrees: {cid}: {why}")
    for cid, why in t.refused:
        print(f"  refused:   {cid}: {why[:160]}")
    m = derive_margins(comparisons)
    print()
    print(f"margins: GPU {m['gpu']['margin']:.1%} ({m['gpu']['short']} of {m['gpu']['figures']} figures short), "
          f"host {m['host']['margin']:.1%} ({m['host']['short']} of {m['host']['figures']} short); {m['gpu']['rule']}")
    if cases:
        print()
        for c in comparisons:
            if c.error:
                continue
            print(f"{c.case.id} [{c.framework}] outcome {c.case.outcome}, memfit {c.level} "
                  f"({c.gpu_ratio:.0%} of the card): {c.why}")
            for n in c.stack_notes:
                print(f"    stack: {n}")
            for f in c.figures:
                m = f.measurement
                planned = "-" if f.planned_bytes is None else f"{f.planned_bytes / 2**30:.2f}"
                err = "" if f.error is None else _pct(f.error)
                print(f"    {m.kind:<18}{','.join(m.window):<22} measured {m.bytes / 2**30:8.2f} GiB  "
                      f"planned {planned:>8} GiB  {err:>8}  ({f.peak_phase})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", action="store_true", help="every figure of every case")
    ap.add_argument("--write-margin", action="store_true", help="rewrite src/memfit/core/verdict_margin.json")
    ap.add_argument("--write-baseline", action="store_true", help="rewrite tests/fixtures/accuracy/baseline.json")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    t0 = time.perf_counter()
    comparisons = run_corpus()
    elapsed = time.perf_counter() - t0
    print_table(comparisons, cases=args.cases)
    print(f"\n({elapsed:.1f} s for the corpus)")
    if args.write_margin:
        from memfit.core.compare.accuracy import derive_margins
        from memfit.core.verdict import MARGIN_FILE

        MARGIN_FILE.write_text(json.dumps(derive_margins(comparisons), indent=2) + "\n", encoding="utf-8")
        print(f"wrote {MARGIN_FILE}")
    if args.write_baseline:
        BASELINE.parent.mkdir(parents=True, exist_ok=True)
        BASELINE.write_text(json.dumps(baseline(comparisons), indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {BASELINE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
