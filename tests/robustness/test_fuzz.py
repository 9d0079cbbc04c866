"""2,000 generated DeepSpeed configs and scenarios (seeds 0-1999, half clean, half dirty; see
fuzz_inputs.py): only ``MemfitError`` is raised, no byte figure is negative, NaN or not an integer,
every key of the DeepSpeed config is read, warned about or refused, and no input takes over 2 s.
benchmarks/fuzz_inputs.py runs the full-size 10,000+ sweep."""

from __future__ import annotations

from collections import Counter

from fuzz_inputs import case, check

SEEDS = range(2000)


def test_two_thousand_generated_scenarios(tmp_path):
    verdicts: Counter[str] = Counter()
    problems = []
    for seed in SEEDS:
        verdict, found = check(case(seed), tmp_path)
        verdicts[verdict] += 1
        if verdict == "crashed" or found:
            problems.append(f"seed {seed}: {verdict}: {'; '.join(found)}")
    assert not problems, f"{len(problems)} of {len(SEEDS)}: " + " | ".join(problems[:10])
    # both halves really exercised: a generator that only ever produced refusals would prove nothing
    assert verdicts["planned"] > 500 and verdicts["refused"] > 500, verdicts
