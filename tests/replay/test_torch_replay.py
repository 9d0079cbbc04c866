"""Live non-DeepSpeed replays (slow): the recorded fixtures are what the code produces today.

Two cases of tests/fixtures/replay_torch are re-run on this CPU through the same supervisor as the
DeepSpeed replays; the sizes read off the objects must equal the fixture's byte for byte, and every
phase's host peak must be within ``TOL_RERUN`` of it (the same code on the same shapes; observed
0 B to a few hundred bytes of scalar noise).
"""

from pathlib import Path

import pytest

from memfit.core.plan import make_plan
from memfit.replay.compare import compare, scenario_of
from memfit.replay.measurement import load_fixture
from memfit.replay.record_torch_fixtures import case_spec
from memfit.replay.runner import run_replay

pytestmark = pytest.mark.slow
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "replay_torch"
TOL_RERUN = 1024


@pytest.mark.parametrize("name", ["llama_lora_ampbf16_adamw", "llama_full_fp32_adafactor"])
def test_live_replay_matches_its_fixture_and_the_plan(name):
    pytest.importorskip("torch")
    m = run_replay(case_spec(name), timeout_s=900)
    assert m.ok, f"{m.error.kind} in {m.error.phase}: {m.error.message}\n{m.error.traceback}"
    recorded = load_fixture(str(FIXTURES / f"{name}.json"))
    assert m.items("load") == recorded.items("load") and m.items("step") == recorded.items("step")
    for ph in ("load", "setup", "forward", "backward", "optimizer_step", "step2.optimizer_step", "save"):
        a, b = m.peak(ph, "host_peak_bytes"), recorded.peak(ph, "host_peak_bytes")
        assert abs(a - b) <= TOL_RERUN, (ph, a, b)
    c = compare(make_plan(scenario_of(m)), m)
    assert c.exact_items_match, [(i.key, i.diff_bytes) for i in c.items]
