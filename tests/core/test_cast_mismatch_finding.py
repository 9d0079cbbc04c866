"""The ``tuner-dtype-mismatch`` finding (``findings/deepspeed.py``): said for a tuner of
``peft.cast_mismatch`` under DeepSpeed fp16/bf16 from 0.19.2 (params-only cast, read off the
0.19.1 / 0.19.2 sources: ``stack.deepspeed.casts_params_only``) with a model built in fp32, and not
otherwise. That the tuners' forward raises is tested against peft in tests/trace."""

import pytest

from memfit.core.plan import make_plan
from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.inputs import ScenarioInputs
from memfit.core.stack.deepspeed import casts_params_only

BASE = dict(model="meta-llama/Llama-3.2-1B", peft_method="tinylora", precision="bf16", gpus="1xa100-80gb",
            deepspeed="examples/deepspeed/zero3_hf_trainer_auto.json", load_dtype="fp32")


def ids(**kw):
    from conftest import ROOT

    kw = {**BASE, **kw}
    kw["deepspeed"] = str(ROOT / kw["deepspeed"])
    return {f.id for f in make_plan(build_scenario(ScenarioInputs(**kw))).findings}


@pytest.mark.parametrize("kw, said", [
    ({}, True),
    (dict(ds_version="0.19.2"), True),
    (dict(ds_version="0.19.1"), False),
    (dict(load_dtype="bf16"), False),
    (dict(peft_method="lora"), False),
    (dict(precision="fp32"), False),
])
def test_said_where_peft_would_raise(kw, said):
    assert ("tuner-dtype-mismatch" in ids(**kw)) is said


def test_release_rule():
    assert casts_params_only("0.19.1", "0.19")[0] is False
    assert casts_params_only("0.19.2", "0.19")[0] is True
    assert casts_params_only(None, "0.19")[0] is True  # 0.19.8 assumed
    assert casts_params_only("0.8.0", "0.8")[0] is False


@pytest.mark.parametrize("version", ("0.19.1", "0.19.2"))
def test_release_rule_matches_the_source(request, tmp_path_factory, version):
    """engine.py ``_configure_distributed_model`` of each release: ``self.module.half()`` /
    ``self.module.bfloat16()`` (buffers cast too) in 0.19.1, the params-only cast in 0.19.2."""
    from conftest import _ds_source

    src = (_ds_source(request, tmp_path_factory, version) / "deepspeed" / "runtime" / "engine.py").read_text()
    body = src[src.index("def _configure_distributed_model"):]
    body = body[:body.index("\n    def ", 10)]
    blanket = "self.module.half()" in body and "self.module.bfloat16()" in body
    assert blanket is not casts_params_only(version, "0.19")[0]
    assert ("Cast params only" in body) is casts_params_only(version, "0.19")[0]
