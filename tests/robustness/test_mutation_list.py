"""The mutation catalogue (``benchmarks/mutations/``) stays in step with the code: every mutation's
``find`` text occurs exactly once in the file it names, so a move or a refactor that strands one
fails here, in the suite, instead of when someone next runs ``benchmarks/mutation.py``."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from mutations import NOT_MUTATED, SCORED, UNOBSERVABLE_MUTATIONS  # noqa: E402


def test_every_mutation_finds_its_code_exactly_once():
    stale = []
    for m in SCORED + UNOBSERVABLE_MUTATIONS:
        f = ROOT / m.path
        n = f.read_text(encoding="utf-8").count(m.find) if f.exists() else 0
        if n != 1:
            stale.append(f"{m.id}: occurs {n} times in {m.path}")
    assert not stale, "\n".join(stale)


def test_ids_are_unique_and_every_mutation_says_why():
    ids = [m.id for m in SCORED + UNOBSERVABLE_MUTATIONS]
    assert len(ids) == len(set(ids))
    assert all(m.why.strip() and m.tests for m in SCORED + UNOBSERVABLE_MUTATIONS)
    assert all(reason.strip() for reason in NOT_MUTATED.values())
