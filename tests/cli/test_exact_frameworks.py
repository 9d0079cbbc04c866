"""`--exact` never claims a trace a plan did not use (issue 21 item 4). The torch/DDP/FSDP/FSDP2 ledgers
take a traced step (``memfit.core.ledger.pytorch.traced``; its figures are checked against the trace in
tests/trace/test_torch_exact_plan.py); where the trace cannot build the model (a bitsandbytes-quantized
base) `--exact` refuses in one line (exit 2) before tracing. Before, `--exact` refused on every one of
these frameworks, and earlier still the trace ran and the plan kept its analytic activations under a
note saying "Forward/backward traced"."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import EXAMPLES, ROOT

REFUSED = ["qlora-llama3-8b-1x24gb.yaml"]

NOT_SCENARIOS = {"frameworks/accelerate_fsdp2_offload.yaml": "an accelerate config, read by fsdp2-offload-llama3-8b-8gpu.yaml"}
"""Shipped YAML files that are inputs of another example, not scenarios: refused in one line."""

SHIPPED = sorted(p.relative_to(EXAMPLES).as_posix() for p in [*EXAMPLES.glob("*.yaml"), *EXAMPLES.glob("frameworks/*.yaml")])


def _exact(name: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memfit.cli", "plan", str(EXAMPLES / name), "--exact", *extra],
                          capture_output=True, text=True, cwd=ROOT, timeout=900, check=False)


@pytest.mark.parametrize("name", SHIPPED)
def test_exact_on_every_shipped_example_traces_or_refuses_in_one_line(name):
    """Every examples/*.yaml and examples/frameworks/*.yaml, as shipped (the models at full size), with one
    override: ``--seq-len 64`` (the examples' 512-4096 tokens make each trace take minutes on two cores;
    the layers and shapes are the example's own). Either the JSON says the activations are traced (every
    ``step.activations`` item, in forward and in backward, is exact and named "(traced)", and a note says
    the step was traced), or memfit refuses in one line with exit 2 and claims no trace."""
    r = _exact(name, "--seq-len", "64", "--json")
    if Path(name).name in REFUSED or name in NOT_SCENARIOS:
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("memfit: error:")]
        why = "not a memfit scenario" if name in NOT_SCENARIOS else "--exact"
        assert r.returncode == 2 and len(lines) == 1 and why in lines[0], r.stderr[-2000:]
        assert "Traceback" not in r.stderr and "traced" not in r.stdout
        return
    assert r.returncode == 0, r.stderr[-2000:]
    plan = json.loads(r.stdout)
    items = [(ph["name"], it) for ph in plan["phases"] for it in ph["items"] if it["key"] == "step.activations"]
    phases = {ph for ph, _ in items}
    assert {"forward", "backward"} <= phases, phases
    for ph, it in items:
        assert it["exact"] is True and re.search(r"\(traced\b", it["name"]), (ph, it)
    assert any("traced from the model's code" in n for n in plan["notes"]), plan["notes"]


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
