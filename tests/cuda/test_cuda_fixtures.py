"""Plan vs the GPU validation kit's recordings in tests/fixtures/cuda/ (run on every CI run).

The recordings come from ``python scripts/gpu_validate.py --out tests/fixtures/cuda`` on a CUDA
machine (README: "GPU validation kit"). Until someone has run it, there is nothing to check and this
module is skipped with that reason, not passed. ``memfit.recording.kit_checks`` says what is checked
and with which tolerance.
"""

from __future__ import annotations

import json

import pytest

from memfit.recording.kit_checks import check_kit

from conftest import FIXTURES

CUDA = FIXTURES / "cuda"

if not (CUDA / "summary.json").exists():
    pytest.skip("no GPU recordings in tests/fixtures/cuda yet: run `python scripts/gpu_validate.py --out "
                "tests/fixtures/cuda` on a CUDA machine (README: GPU validation kit) and commit its output",
                allow_module_level=True)

SUMMARY = json.loads((CUDA / "summary.json").read_text())
CHECKS = check_kit(CUDA)


def test_recorded_on_a_gpu():
    assert SUMMARY["dry_run"] is False, "tests/fixtures/cuda holds a CPU dry run; it must be a CUDA recording"
    assert any(r["status"] == "ok" for r in SUMMARY["cases"])


@pytest.mark.parametrize("check", [c for c in CHECKS if c.asserted], ids=lambda c: f"{c.case}:{c.what}")
def test_plan_vs_recording(check):
    assert check.ok, f"{check.case} {check.what}: planned {check.planned_bytes}, recorded {check.recorded_bytes}; {check.detail}"


def test_every_case_ran_or_says_why():
    for c in CHECKS:
        if c.what == "ran":
            assert c.ok, f"{c.case}: {c.detail}"
