"""`memfit plan --exact` on the torch, DDP, FSDP and FSDP2 ledgers (issue 21 item 4): the traced step's
activations replace the analytic ones, booked stage by stage (``memfit.core.ledger.pytorch.traced``).

One fake-tensor trace of the shipped Qwen2.5-0.5B config (LoRA, AMP bf16 on a bf16 base, 2 x 64
tokens): the four frameworks run the same per-rank step, so they take the same trace options (checked).
For each, the plan's forward peak holds exactly the trace's activation-side bytes at its forward peak
(saved + outputs + held + inputs as ``step.activations``, the temporaries as
``step.traced_temporaries``), every block's stage holds what its modules allocated, and the figure
differs from the analytic plan's (the estimate is not what was traced).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

MODEL = "Qwen/Qwen2.5-0.5B"
FRAMEWORKS = {"torch": "1xa100-80gb", "ddp": "2xa100-80gb", "fsdp": "2xa100-80gb", "fsdp2": "2xa100-80gb"}


def _scenario(framework: str, **extra):
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.inputs import ScenarioInputs

    return build_scenario(ScenarioInputs(model=MODEL, framework=framework, precision="amp_bf16",
                                         gpus=FRAMEWORKS[framework], seq_len=64, micro_batch=2, load_dtype="bf16",
                                         peft_method="lora",
                                         peft_options={"lora_r": 8, "target_modules": "q_proj,v_proj"}, **extra))


@pytest.fixture(scope="module")
def traced():
    from memfit.trace.ledger_step import ledger_step, trace_options_for, trace_scenario

    scenarios = {fw: _scenario(fw) for fw in FRAMEWORKS}
    options = {fw: trace_options_for(sc) for fw, sc in scenarios.items()}
    assert len(set(options.values())) == 1, options  # one per-rank step: one trace serves them all
    opts = options["torch"]
    assert (opts.dtype, opts.adapter_dtype, opts.autocast) == ("bf16", "fp32", "bf16")
    trace = trace_scenario(scenarios["torch"])
    return scenarios, trace, {fw: ledger_step(sc, trace) for fw, sc in scenarios.items()}


def _activations(plan, phase="forward"):
    return {i.key: i for i in plan.phase(phase).items if i.category == "activations"}


@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_traced_plan_holds_the_trace_activations(traced, framework):
    from memfit.core.plan import make_plan

    scenarios, trace, steps = traced
    sc, step = scenarios[framework], steps[framework]
    b = trace.forward.breakdown
    plan = make_plan(sc, step)
    acts = _activations(plan)
    assert acts["step.activations"].bytes == b.input_bytes + b.saved_bytes + b.output_bytes + b.held_bytes
    assert acts["step.traced_temporaries"].bytes == b.temporary_bytes
    assert sum(i.bytes for i in acts.values()) == b.activation_side_bytes
    assert "traced" in acts["step.activations"].name and acts["step.activations"].exact
    assert any("traced from the model's code" in n for n in plan.notes)
    analytic = _activations(make_plan(sc))
    assert analytic["step.activations"].bytes != acts["step.activations"].bytes
    assert "step.traced_temporaries" not in analytic


def test_each_block_holds_its_modules_bytes(traced):
    from memfit.core.ledger.pytorch.params import build_torch_model
    from memfit.core.ledger.pytorch.traced import traced_stages

    scenarios, trace, steps = traced
    m = build_torch_model(scenarios["torch"])
    st = traced_stages(steps["torch"], [p.name for p in m.params], [p.stage for p in m.params], m.stages)
    layers = scenarios["torch"].model.arch.num_layers
    assert len(st.kept) == layers + 2
    for i in range(layers):
        under = f"base_model.model.model.layers.{i}."
        expected = sum(r.kept_bytes for r in steps["torch"].by_module if r.module.startswith(under))
        assert st.kept[i + 1] == expected > 0
    assert sum(st.kept) + st.temporary == trace.forward.breakdown.activation_side_bytes
    assert st.temporary_stage == layers + 1  # the peak is the loss, in the head


def test_quantized_base_refuses_in_one_line():
    from memfit.errors import MemfitError
    from memfit.trace.ledger_step import torch_trace_options

    sc = _scenario("torch", quantization={"method": "4bit"})
    with pytest.raises(MemfitError, match="--exact cannot trace a 4bit bitsandbytes base") as err:
        torch_trace_options(sc)
    assert "\n" not in str(err.value)
