"""`--exact` never claims a trace a plan did not use (issue 21 item 4). The torch/DDP/FSDP/FSDP2 ledgers
take a traced step (``memfit.core.ledger.pytorch.traced``; its figures are checked against the trace in
tests/trace/test_torch_exact_plan.py); where the trace cannot build the model (a bitsandbytes-quantized
base) `--exact` refuses in one line (exit 2) before tracing. Before, `--exact` refused on every one of
these frameworks, and earlier still the trace ran and the plan kept its analytic activations under a
note saying "Forward/backward traced"."""

import json
import subprocess
import sys

import pytest

from conftest import EXAMPLES, ROOT

REFUSED = ["qlora-llama3-8b-1x24gb.yaml"]


@pytest.mark.parametrize("name", REFUSED)
def test_exact_on_a_quantized_base_refuses_in_one_line(name):
    r = subprocess.run([sys.executable, "-m", "memfit.cli", "plan", str(EXAMPLES / "frameworks" / name), "--exact"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("memfit: error:")]
    assert len(lines) == 1 and "--exact" in lines[0] and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "traced" not in r.stdout


def test_exact_on_ddp_traces():
    """The shipped DDP example, at 64 tokens (a flag overrides the YAML) to keep the trace short: the
    JSON says the activations are traced and exact."""
    r = subprocess.run([sys.executable, "-m", "memfit.cli", "plan", str(EXAMPLES / "frameworks" / "ddp-lora-llama2-7b-2gpu.yaml"),
                        "--exact", "--seq-len", "64", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    plan = json.loads(r.stdout)
    fwd = {i["key"]: i for i in next(ph for ph in plan["phases"] if ph["name"] == "forward")["items"]}
    assert "traced" in fwd["step.activations"]["name"] and fwd["step.activations"]["exact"] is True
    assert any("traced from the model's code" in n for n in plan["notes"])


def test_make_plan_refuses_a_traced_step_it_would_drop():
    from memfit.core.ledger_types import TracedStep
    from memfit.core.plan import make_plan
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.read import read_scenario_file
    from memfit.errors import MemfitError

    sc = build_scenario(read_scenario_file(EXAMPLES / "frameworks" / "qlora-llama3-8b-1x24gb.yaml"))
    with pytest.raises(MemfitError, match="traced step"):
        make_plan(sc, TracedStep(forward_items=(), backward_items=(), note="synthetic"))
