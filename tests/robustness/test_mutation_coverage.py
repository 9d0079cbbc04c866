"""The mutation catalogue covers every module issue 25 names: each has at least one scored mutation
(``benchmarks/mutations/``) or a ``NOT_MUTATED`` entry naming the file with the reason it has none.

Whether the mutations are killed is what ``python benchmarks/mutation.py`` measures (a benchmark, not a
test: it takes an hour on two cores); this test only keeps a new module from joining these areas
without one.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from mutations import NOT_MUTATED, SCORED  # noqa: E402

SRC = ROOT / "src" / "memfit" / "core"
AREAS = (
    sorted((SRC / "alloc").glob("*.py"))
    + [SRC / "optimizers.py", SRC / "quant.py"]
    + sorted((SRC / "ledger" / "pytorch").glob("ddp*.py"))
    + sorted((SRC / "ledger" / "pytorch").glob("fsdp*.py"))
    + sorted((SRC / "peft" / "tuners").glob("*.py"))
)
"""core/alloc/, core/optimizers.py, core/quant.py, the DDP and FSDP recipes, the PEFT tuners."""


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def test_every_module_of_the_named_areas_has_a_mutation_or_a_reason():
    mutated = {m.path for m in SCORED}
    missing = [_rel(p) for p in AREAS if _rel(p) not in mutated and _rel(p) not in NOT_MUTATED]
    assert not missing, f"no mutation and no NOT_MUTATED reason: {missing}"


def test_not_mutated_files_exist_and_have_no_scored_mutation():
    for key in NOT_MUTATED:
        if key.startswith("src/"):
            assert (ROOT / key).is_file(), key
            assert key not in {m.path for m in SCORED}, f"{key} is mutated: drop its NOT_MUTATED entry"
