"""Swap space (``hardware.swap`` / ``--swap``) in the host verdict, and ``train.save: false``.

Swap takes pageable memory, never page-locked memory (``cudaHostAlloc`` / ``pin_memory`` lock the
pages): a phase whose host figure exceeds the RAM is "at risk" (it pages out) while it stays within
RAM + swap and its page-locked bytes fit in the RAM; beyond RAM + swap, or with more page-locked bytes
than RAM, it does not fit. Without swap the verdict is as before (every existing plan is unchanged).
The RAM sizes below come from each plan's own figures, not fixed numbers.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from memfit.core.plan import make_plan
from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.inputs import ScenarioInputs
from memfit.core.verdict import PINNED_NODE, host_figure, judge
from memfit.errors import MemfitError

GiB = 2**30
# FSDP1 with CPU offload: a phase holding both pageable and page-locked host memory
BASE = dict(model="meta-llama/Llama-2-7b-hf", framework="fsdp", precision="bf16", optim="adamw_torch",
            peft_method="lora", fsdp={"cpu_offload": True, "use_orig_params": False}, gpus="2x24GiB",
            seq_len=512, micro_batch=1, cpu_ram="1024GiB")


@pytest.fixture(scope="module")
def plan():
    return make_plan(build_scenario(ScenarioInputs(**BASE)))


def _worst(plan):
    ph = max(plan.phases, key=host_figure)
    locked = ph.cpu_pinned_locked_bytes * ph.ranks_per_node
    return ph, host_figure(ph), locked


def _hw(plan, ram, swap=0):
    sc = build_scenario(ScenarioInputs(**BASE))
    return dataclasses.replace(sc.hardware, cpu_ram_bytes=ram, swap_bytes=swap)


def test_the_case_has_pageable_and_locked_memory(plan):
    ph, host, locked = _worst(plan)
    assert 0 < locked < host, (ph.name, host, locked)


def test_without_swap_over_the_ram_does_not_fit(plan):
    ph, host, locked = _worst(plan)
    v = judge(plan.phases, _hw(plan, host - GiB))
    assert v.level == "does_not_fit" and any(f.device == "cpu" and f.phase == ph.name for f in v.failures)


def test_swap_that_takes_the_pageable_excess_is_at_risk(plan):
    ph, host, locked = _worst(plan)
    v = judge(plan.phases, _hw(plan, host - GiB, swap=2 * GiB))
    assert v.level == "at_risk", v.failures
    risk = next(r for r in v.risks if r.device == "cpu" and r.phase == ph.name)
    assert "swap" in risk.why and "page-locked" in risk.why


def test_beyond_ram_plus_swap_does_not_fit(plan):
    ph, host, locked = _worst(plan)
    v = judge(plan.phases, _hw(plan, host - 3 * GiB, swap=2 * GiB))
    f = next(f for f in v.failures if f.device == "cpu" and f.phase == ph.name)
    assert f.available_bytes == host - GiB and "swap" in f.figure


def test_swap_cannot_take_page_locked_memory(plan):
    ph, host, locked = _worst(plan)
    v = judge(plan.phases, _hw(plan, locked - GiB, swap=host))
    f = next(f for f in v.failures if f.device == "cpu")
    assert f.figure == PINNED_NODE and f.needed_bytes >= locked


def test_swap_is_read_from_the_flag_and_the_file(tmp_path):
    sc = build_scenario(ScenarioInputs(**{**BASE, "swap": "10GB"}))
    assert sc.hardware.swap_bytes == 10 * 10**9
    from memfit.core.scenario.read import read_scenario_file

    f = tmp_path / "run.yaml"
    f.write_text("model: gpt2\nhardware: {cpu_ram: 64GB, swap: 8GiB}\ntrain: {save: false}\n")
    sc = build_scenario(read_scenario_file(f))
    assert sc.hardware.swap_bytes == 8 * GiB and sc.train.save is False


@pytest.mark.parametrize("value", ["-3GB", "3", "lots"])
def test_a_bad_swap_is_one_line(value):
    with pytest.raises(MemfitError, match="swap"):
        build_scenario(ScenarioInputs(**{**BASE, "swap": value}))


def test_save_false_drops_the_save_phase_and_says_so(plan):
    assert "save" in [p.name for p in plan.phases]
    p2 = make_plan(build_scenario(ScenarioInputs(**{**BASE, "save": False})))
    names = [p.name for p in p2.phases]
    assert "save" not in names and names == [p.name for p in plan.phases if p.name != "save"]
    assert any("No save phase" in n for n in p2.notes)
    assert not any("No save phase" in n for n in plan.notes)


CASES = sorted(c for c in (Path(__file__).parents[1] / "fixtures" / "public_runs").glob("*.yaml")
               if not c.name.endswith(".accelerate.yaml"))  # the cases' accelerate configs are inputs


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_a_published_run_case_given_as_a_scenario_names_compare(case):
    """A user who runs `memfit plan` on a published-run case (tests/fixtures/public_runs/*.yaml) gets one line
    naming the command that reads it, not a list of unknown keys, nor the first bare date of its
    ``source:`` (YAML reads ``date: 2023-02-13`` as a date, which a scenario file refuses)."""
    from memfit.core.scenario.read import read_scenario_file

    with pytest.raises(MemfitError, match=r"published-run case, not a memfit scenario: `memfit compare ") as err:
        read_scenario_file(case)
    assert "\n" not in str(err.value)


def test_a_bare_date_in_a_scenario_is_still_refused(tmp_path):
    from memfit.core.scenario.read import read_scenario_file

    f = tmp_path / "s.yaml"
    f.write_text("model: gpt2\nname: 2023-02-13\n")
    with pytest.raises(MemfitError, match=r"name is a date"):
        read_scenario_file(f)
