"""`--exact` never claims a trace a plan did not use (issue 21 item 4): the torch/DDP/FSDP/FSDP2 ledgers
take no traced step yet, so `--exact` on their shipped examples refuses in one line (exit 2) before
tracing; before this, the trace ran (30 s on the QLoRA example) and the plan kept its analytic
activations under a note saying "Forward/backward traced"."""

import subprocess
import sys

import pytest

from conftest import EXAMPLES, ROOT

TORCH_EXAMPLES = ["qlora-llama3-8b-1x24gb.yaml", "ddp-lora-llama2-7b-2gpu.yaml", "fsdp2-offload-llama3-8b-8gpu.yaml",
                  "lora-ampbf16-llama2-7b-1gpu.yaml"]


@pytest.mark.parametrize("name", TORCH_EXAMPLES)
def test_exact_on_a_torch_framework_refuses_in_one_line(name):
    r = subprocess.run([sys.executable, "-m", "memfit.cli", "plan", str(EXAMPLES / "frameworks" / name), "--exact"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("memfit: error:")]
    assert len(lines) == 1 and "--exact" in lines[0] and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "traced" not in r.stdout


def test_make_plan_refuses_a_traced_step_it_would_drop():
    from memfit.core.ledger_types import TracedStep
    from memfit.core.plan import make_plan
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.read import read_scenario_file
    from memfit.errors import MemfitError

    sc = build_scenario(read_scenario_file(EXAMPLES / "frameworks" / "qlora-llama3-8b-1x24gb.yaml"))
    with pytest.raises(MemfitError, match="traced step"):
        make_plan(sc, TracedStep(forward_items=(), backward_items=(), note="synthetic"))
