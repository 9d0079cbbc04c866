"""Live non-DeepSpeed replays (slow): the recorded fixtures are what the code produces today.

Two cases of tests/fixtures/replay_torch are re-run on this CPU through the same supervisor as the
DeepSpeed replays; the sizes read off the objects must equal the fixture's byte for byte, and every
phase's host peak must be within ``TOL_RERUN`` of it.
"""

from pathlib import Path

import pytest

from memfit.core.plan import make_plan
from memfit.replay.compare import compare, scenario_of
from memfit.replay.measurement import load_fixture
from memfit.replay.pytorch.record_fixtures import case_spec
from memfit.replay.runner import run_replay

pytestmark = pytest.mark.slow
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "replay_torch"
TOL_RERUN = 0
"""The same code on the same shapes on the CPU the fixtures were recorded on (an Intel Xeon with AMX):
observed 0 B in every phase of both cases, and of all 25 torch and 7 example fixtures re-recorded
(python -m memfit.replay.pytorch.record_fixtures); 2x that. Another CPU's kernels could allocate
otherwise inside a matmul (the DeepSpeed fixtures' AMX workspace,
test_activations_vs_replay.CPU_BACKWARD_WORKSPACE_BYTES), but neither case peaks inside one (their
peaks are the loss and its backward, test_torch_activations_vs_replay.py); the failure names both CPUs."""


@pytest.mark.parametrize("name", ["llama_lora_ampbf16_adamw", "llama_full_fp32_adafactor"])
def test_live_replay_matches_its_fixture_and_the_plan(name):
    pytest.importorskip("torch")
    m = run_replay(case_spec(name), timeout_s=900)
    assert m.ok, f"{m.error.kind} in {m.error.phase}: {m.error.message}\n{m.error.traceback}"
    recorded = load_fixture(str(FIXTURES / f"{name}.json"))
    assert m.items("load") == recorded.items("load") and m.items("step") == recorded.items("step")
    for ph in ("load", "setup", "forward", "backward", "optimizer_step", "step2.optimizer_step", "save"):
        a, b = m.peak(ph, "host_peak_bytes"), recorded.peak(ph, "host_peak_bytes")
        assert abs(a - b) <= TOL_RERUN, f"{ph}: rerun {a:,} B on {getattr(m.device, 'name', '?')}, fixture {b:,} B on {getattr(recorded.device, 'name', '?')}"
    c = compare(make_plan(scenario_of(m)), m)
    assert c.exact_items_match, [(i.key, i.diff_bytes) for i in c.items]
