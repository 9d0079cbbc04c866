"""2,000 generated record files (seeds 0-1999, a quarter of each kind: memory_stats JSON, snapshot
pickles, nvidia-smi CSV, see_memory_usage logs; most damaged, see fuzz_records.py): only
``MemfitError`` leaves, in one line; no figure of a record or of its reconciliation with the seed
plan is negative, NaN or not an integer; no hostile pickle runs. 10,000 more seeds behind ``slow``."""

from __future__ import annotations

from collections import Counter

import pytest

from conftest import SEED
from fuzz_records import KINDS, check_record, record_case


@pytest.fixture(scope="module")
def plan():
    from memfit.core.plan import make_plan
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.read import read_scenario_file

    return make_plan(build_scenario(read_scenario_file(SEED)))


def _sweep(seeds, tmp_path, plan) -> Counter:
    verdicts: Counter[tuple[str, str]] = Counter()
    problems = []
    for seed in seeds:
        kind, path, marker = record_case(seed, tmp_path)
        verdict, found = check_record(path, marker, plan, render=seed % 25 == 0)
        path.unlink()
        verdicts[(kind, verdict)] += 1
        if verdict == "crashed" or found:
            problems.append(f"seed {seed} ({kind}): {verdict}: {'; '.join(found)}")
    assert not problems, f"{len(problems)} of {len(seeds)}: " + " | ".join(problems[:10])
    return verdicts


def test_two_thousand_generated_records(tmp_path, plan):
    verdicts = _sweep(range(2000), tmp_path, plan)
    # every kind really exercised both ways: a generator that only made refusals would prove nothing
    for kind in KINDS:
        assert verdicts[(kind, "read")] > 50 and verdicts[(kind, "refused")] > 50, verdicts


@pytest.mark.slow
def test_ten_thousand_more_generated_records(tmp_path, plan, request):
    if "slow" not in (request.config.getoption("-m") or ""):
        pytest.skip("the full-size sweep (minutes: with the input-file sweep, 6.4 min on 2 loaded cores): run with -m slow")
    verdicts = _sweep(range(100_000, 110_000), tmp_path, plan)
    for kind in KINDS:
        assert verdicts[(kind, "read")] > 250 and verdicts[(kind, "refused")] > 250, verdicts
