"""The full-size fuzz sweep of memfit's inputs (tests/robustness/fuzz_inputs.py): N seeded
DeepSpeed configs and scenarios (default 10,000, from seed 100,000 so it does not repeat the test
suite's 2,000), each checked for: nothing but MemfitError raised, no negative/NaN/non-integer byte
figure, every config key read, warned about or refused, and no case over 2 s.

Run: python benchmarks/fuzz_inputs.py [N] [FIRST_SEED]    (exit status 1 if any case fails)
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests" / "robustness")]

from fuzz_inputs import case, check  # noqa: E402


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    first = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
    verdicts: Counter[str] = Counter()
    failures = []
    slowest = (0.0, -1)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="memfit-fuzz-") as tmp:
        for seed in range(first, first + n):
            t0 = time.perf_counter()
            verdict, problems = check(case(seed), Path(tmp))
            slowest = max(slowest, (time.perf_counter() - t0, seed))
            verdicts[verdict] += 1
            if verdict == "crashed" or problems:
                failures.append((seed, verdict, problems))
    took = time.perf_counter() - start
    print(f"{n:,} cases (seeds {first}-{first + n - 1}) in {took:.1f} s ({n / took:,.0f}/s): "
          + ", ".join(f"{k} {v:,}" for k, v in sorted(verdicts.items()))
          + f"; slowest {slowest[0] * 1000:.0f} ms (seed {slowest[1]})")
    for seed, verdict, problems in failures[:20]:
        print(f"  seed {seed}: {verdict}: {'; '.join(problems)}")
    print(f"{len(failures)} failing" if failures else "all pass")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
