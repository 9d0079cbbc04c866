"""A load dtype no input gave: memfit plans fp32 and says whether that is the stack's from_pretrained default
(transformers 4.x: fp32) or not (5.x: the checkpoint's dtype, ``dtype='auto'``; checked against the wheels in
tests/exact/test_stack_against_sources.py)."""

from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.inputs import ScenarioInputs


def _load_line(sc) -> str:
    return next(str(a) for a in sc.assumptions if "load dtype" in str(a))


def test_transformers_5_loads_the_checkpoint_dtype_and_the_plan_says_it_differs():
    sc = build_scenario(ScenarioInputs(model="meta-llama/Llama-2-7b-hf", peft_method="lora"))
    assert sc.load.dtype == "fp32"
    line = _load_line(sc)
    assert "not transformers 5.24's" in line and "checkpoint's fp16" in line and "dtype='auto'" in line


def test_transformers_4_default_is_fp32():
    sc = build_scenario(ScenarioInputs(model="meta-llama/Llama-2-7b-hf", peft_method="lora", transformers_version="4.40"))
    assert "from_pretrained's default" in _load_line(sc)


def test_an_fp32_checkpoint_under_5_is_the_default_itself():
    sc = build_scenario(ScenarioInputs(model="gpt2"))  # no torch_dtype in its config.json: fp32
    assert "from_pretrained's default" in _load_line(sc)
