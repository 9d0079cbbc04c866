"""Generated TrainingArguments/SFTConfig, accelerate, BitsAndBytesConfig and lengths files (seeded; half
clean, half dirty; see fuzz_files.py): only a one-line ``MemfitError`` is raised, no byte figure is
negative, NaN or not an integer, every key of every file is read, warned about or refused, and no case
takes over 2 s. 2,000 in every run; 10,000 more behind ``slow``."""

from __future__ import annotations

from collections import Counter

import pytest

from fuzz_files import case, check


def _sweep(seeds, tmp_path):
    verdicts: Counter[str] = Counter()
    problems = []
    for seed in seeds:
        verdict, found = check(case(seed), tmp_path)
        verdicts[verdict] += 1
        if verdict == "crashed" or found:
            problems.append(f"seed {seed}: {verdict}: {'; '.join(found)}")
    assert not problems, f"{len(problems)} of {len(seeds)}: " + " | ".join(problems[:10])
    return verdicts


def test_two_thousand_generated_input_files(tmp_path):
    verdicts = _sweep(range(2000), tmp_path)
    # both halves really exercised: a generator that only ever produced refusals would prove nothing
    assert verdicts["planned"] > 400 and verdicts["refused"] > 400, verdicts


@pytest.mark.slow
def test_ten_thousand_more_generated_input_files(tmp_path, request):
    if "slow" not in (request.config.getoption("-m") or ""):
        pytest.skip("the full-size sweep (about 5 minutes): run with -m slow")
    verdicts = _sweep(range(100_000, 110_000), tmp_path)
    assert verdicts["planned"] > 2000 and verdicts["refused"] > 2000, verdicts
