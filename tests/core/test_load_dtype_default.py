"""A load dtype no input gave is the stack's from_pretrained default (``stack.transformers.load_dtype_default``):
transformers 5.x reads a missing dtype as ``dtype='auto'``, config.json's dtype; 4.x loads fp32, a bitsandbytes
model fp16. The rules are checked against the released wheels in tests/exact/test_stack_against_sources.py; here,
that the plan books what the rule gives and says why."""

import pytest

from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.inputs import ScenarioInputs
from memfit.core.stack.transformers import load_dtype_default


def _load_line(sc) -> str:
    return next(str(a) for a in sc.assumptions if "load dtype" in str(a))


@pytest.mark.parametrize(("line", "config_dtype", "quantized", "want"), [
    ("5.24", "bf16", False, "bf16"), ("5.0", "fp16", True, "fp16"), ("5.24", None, False, "fp32"),
    ("5.24", None, True, "fp32"), ("4.57", "bf16", False, "fp32"), ("4.31", "bf16", True, "fp16"),
    ("4.15", "fp16", False, "fp32"), (None, "bf16", False, "fp32")])
def test_the_rule_per_release(line, config_dtype, quantized, want):
    dtype, why = load_dtype_default(line, config_dtype=config_dtype, quantized=quantized)
    assert dtype == want and why


def test_transformers_5_plans_the_checkpoint_dtype_and_says_so():
    sc = build_scenario(ScenarioInputs(model="meta-llama/Llama-2-7b-hf", peft_method="lora"))  # default stack 5.24
    assert sc.load.dtype == "fp16"  # Llama-2-7b-hf's config.json: "torch_dtype": "float16"
    line = _load_line(sc)
    assert "transformers 5.24" in line and "dtype='auto'" in line and "config.json's fp16" in line


def test_transformers_4_loads_fp32_and_a_bitsandbytes_model_fp16():
    sc = build_scenario(ScenarioInputs(model="meta-llama/Llama-2-7b-hf", peft_method="lora", transformers_version="4.40"))
    assert sc.load.dtype == "fp32" and "get_default_dtype" in _load_line(sc)
    q = build_scenario(ScenarioInputs(model="meta-llama/Llama-2-7b-hf", peft_method="lora", quantization={"method": "4bit"},
                                     transformers_version="4.40"))
    assert q.load.dtype == "fp16" and "bitsandbytes" in _load_line(q)


def test_an_explicit_load_dtype_wins_and_is_not_an_assumption():
    sc = build_scenario(ScenarioInputs(model="meta-llama/Llama-2-7b-hf", peft_method="lora", load_dtype="fp32"))
    assert sc.load.dtype == "fp32"
    assert not any("load dtype" in str(a) for a in sc.assumptions)


def test_a_config_without_dtype_under_5_is_fp32_said():
    sc = build_scenario(ScenarioInputs(model="gpt2"))  # no torch_dtype in its config.json
    assert sc.load.dtype == "fp32" and "fp32 assumed" in _load_line(sc)


def test_the_default_load_dtype_moves_the_plan():
    """The 5.x default halves the weights' bytes: the load phase's host RAM is below fp32's."""
    from memfit.core.plan import make_plan

    base = dict(model="meta-llama/Llama-2-7b-hf", peft_method="lora")
    auto = make_plan(build_scenario(ScenarioInputs(**base))).phase("load")
    fp32 = make_plan(build_scenario(ScenarioInputs(**base, load_dtype="fp32"))).phase("load")
    assert auto.cpu_pageable_bytes < fp32.cpu_pageable_bytes


def test_a_deepspeed_config_without_precision_on_a_16_bit_default_names_the_default(tmp_path):
    """DeepSpeed trains a 16-bit model as it is when fp16/bf16 are off (not modelled: refused); where the 16 bits
    come from the stack's default, the one line says so, and --load-dtype fp32 plans it."""
    from memfit.errors import MemfitError

    import json

    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}))
    base = dict(model="EleutherAI/pythia-1b", deepspeed=str(ds))
    with pytest.raises(MemfitError, match=r"loaded in fp16 \(transformers 5\.24: .*dtype='auto'"):
        build_scenario(ScenarioInputs(**base))
    assert build_scenario(ScenarioInputs(**base, load_dtype="fp32")).load.dtype == "fp32"
