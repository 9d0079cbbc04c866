"""memfit's precedence between the user's files against what transformers and accelerate do with the
same files (tests/core/test_precedence.py has the rule itself):

- TrainingArguments' ``bf16``/``fp16`` against accelerate's ``mixed_precision`` (which ``accelerate
  launch`` exports as ``ACCELERATE_MIXED_PRECISION``): ``TrainingArguments.mixed_precision``;
- a TrainingArguments file with a ``deepspeed`` config: what ``HfTrainerDeepSpeedConfig`` fills from the
  same arguments (``trainer_config_process``/``trainer_config_finalize``), and the mismatches it refuses;
- an unknown key: ``TrainingArguments(**d)`` and accelerate's ``ClusterConfig.from_yaml_file`` refuse it,
  ``BitsAndBytesConfig`` ignores it (memfit refuses / warns the same), and the types BitsAndBytesConfig
  refuses.
"""

from __future__ import annotations

import json
import types

import pytest
import yaml

from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.inputs import ScenarioInputs
from memfit.errors import MemfitError

transformers = pytest.importorskip("transformers")

_AMP = {"bf16": "amp_bf16", "fp16": "amp_fp16", "no": "fp32"}


def _build(**kw):
    """The scenario, where the library accepts the files: a refusal is a wrong answer (a failed comparison)."""
    try:
        return build_scenario(ScenarioInputs(model="gpt2", **kw))
    except MemfitError as e:
        pytest.fail(f"memfit refused what the library accepts: {e}")


@pytest.mark.parametrize("ta,accelerate_mp", [({"bf16": True}, "no"), ({}, "fp16"), ({"fp16": True}, "bf16"),
                                              ({}, "no"), ({"bf16": False}, "bf16"), ({"fp16": True}, None)])
def test_mixed_precision_follows_training_arguments_then_accelerate(tmp_path, monkeypatch, ta, accelerate_mp):
    if accelerate_mp is None:
        monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    else:
        monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", accelerate_mp)
    theirs = transformers.TrainingArguments(output_dir=str(tmp_path / "o"), use_cpu=True, report_to=[], **ta)
    p = tmp_path / "ta.json"
    p.write_text(json.dumps({"output_dir": "o", **ta}))
    acc = None
    if accelerate_mp is not None:
        acc = tmp_path / "acc.yaml"
        acc.write_text(yaml.safe_dump({"compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU",
                                       "mixed_precision": accelerate_mp, "num_machines": 1, "num_processes": 2}))
    sc = _build(gpus="2xa100-80gb", training_args=str(p), accelerate_config=str(acc) if acc else None)
    assert sc.torch.precision == _AMP[theirs.mixed_precision]


DS_AUTO = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
           "train_batch_size": "auto", "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
           "fp16": {"enabled": "auto"}, "zero_optimization": {"stage": 2}}


def _trainer_fills(ta: dict, ds: dict, tmp_path):
    """``HfTrainerDeepSpeedConfig`` run over ``ds`` with the TrainingArguments built from ``ta``."""
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    args = transformers.TrainingArguments(output_dir=str(tmp_path / "o"), use_cpu=True, report_to=[], **ta)
    hf = HfTrainerDeepSpeedConfig(json.loads(json.dumps(ds)))
    try:
        hf.trainer_config_process(args)
        hf.trainer_config_finalize(args, types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=768)), 10)
        return hf.config
    finally:
        unset_hf_deepspeed_config()


@pytest.mark.parametrize("ta", [{}, {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "bf16": True},
                                {"fp16": True, "max_grad_norm": 0.5}])
def test_training_arguments_fill_deepspeed_auto_as_the_trainer_does(tmp_path, ta):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(DS_AUTO))
    theirs = _trainer_fills(ta, DS_AUTO, tmp_path)
    p = tmp_path / "ta.json"
    p.write_text(json.dumps({"output_dir": "o", "deepspeed": str(ds), **ta}))
    mine = _build(gpus="1xa100-80gb", training_args=str(p)).deepspeed_json
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size",
                "gradient_clipping"):
        assert mine[key] == theirs[key], key
    assert mine["bf16"]["enabled"] == theirs["bf16"]["enabled"] and mine["fp16"]["enabled"] == theirs["fp16"]["enabled"]


@pytest.mark.parametrize("written", [{"train_micro_batch_size_per_gpu": 4}, {"bf16": {"enabled": True}},
                                     {"gradient_accumulation_steps": 8}])
def test_a_written_value_the_training_arguments_contradict_is_refused_by_both(tmp_path, written):
    raw = {**DS_AUTO, **written}
    with pytest.raises(ValueError, match="mismatch TrainingArguments"):
        _trainer_fills({}, raw, tmp_path)
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(raw))
    p = tmp_path / "ta.json"
    p.write_text(json.dumps({"output_dir": "o", "deepspeed": str(ds)}))
    with pytest.raises(MemfitError, match="Trainer refuses this"):
        build_scenario(ScenarioInputs(model="gpt2", gpus="1xa100-80gb", training_args=str(p)))


def test_an_unknown_training_arguments_key_is_refused_by_both(tmp_path):
    with pytest.raises(TypeError):
        transformers.TrainingArguments(output_dir="o", per_device_train_batch_sise=2)
    p = tmp_path / "ta.json"
    p.write_text(json.dumps({"output_dir": "o", "per_device_train_batch_sise": 2}))
    with pytest.raises(MemfitError, match="did you mean 'per_device_train_batch_size'"):
        build_scenario(ScenarioInputs(model="gpt2", training_args=str(p)))


def test_an_unknown_accelerate_key_is_refused_by_both(tmp_path):
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import load_config_from_file

    p = tmp_path / "acc.yaml"
    p.write_text(yaml.safe_dump({"compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU",
                                 "num_processes": 2, "mixed_precison": "bf16"}))
    with pytest.raises(ValueError, match="unknown keys"):
        load_config_from_file(str(p))
    with pytest.raises(MemfitError, match="did you mean 'mixed_precision'"):
        build_scenario(ScenarioInputs(model="gpt2", gpus="2xa100-80gb", accelerate_config=str(p)))


def test_bitsandbytes_ignores_an_unknown_key_and_memfit_warns(tmp_path, caplog):
    cfg = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_tpye="nf4")
    assert cfg.bnb_4bit_quant_type == "fp4"  # the misspelled key did nothing
    p = tmp_path / "bnb.json"
    p.write_text(json.dumps({"load_in_4bit": True, "bnb_4bit_quant_tpye": "nf4"}))
    sc = _build(peft_method="lora", gpus="1xrtx4090", bnb_config=str(p))
    assert sc.quant.quant_type == "fp4"
    assert any("did you mean 'bnb_4bit_quant_type'" in w for w in sc.input_warnings)


@pytest.mark.parametrize("bad", [{"llm_int8_skip_modules": 5}, {"load_in_4bit": "yes please"},
                                 {"bnb_4bit_use_double_quant": 1}])
def test_bitsandbytes_config_types_are_refused_by_both(tmp_path, bad):
    with pytest.raises((TypeError, ValueError)):
        transformers.BitsAndBytesConfig(**{"load_in_4bit": True, **bad})
    p = tmp_path / "bnb.json"
    p.write_text(json.dumps({"load_in_4bit": True, **bad}))
    with pytest.raises(MemfitError, match="invalid value"):
        build_scenario(ScenarioInputs(model="gpt2", peft_method="lora", gpus="1xrtx4090", bnb_config=str(p)))


_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "uint8": "uint8"}


@pytest.mark.parametrize("raw", [{"load_in_4bit": True}, {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
                                 {"load_in_4bit": True, "bnb_4bit_compute_dtype": "bfloat16",
                                  "bnb_4bit_use_double_quant": True}, {"load_in_8bit": True}])
def test_a_hand_written_bnb_config_takes_bitsandbytes_config_defaults(tmp_path, raw):
    """A BitsAndBytesConfig JSON written by hand (only the keys the user cares about): every key it leaves out
    takes the value BitsAndBytesConfig(**raw) gives it."""
    theirs = transformers.BitsAndBytesConfig(**raw)
    p = tmp_path / "bnb.json"
    p.write_text(json.dumps(raw))
    q = _build(peft_method="lora", gpus="1xrtx4090", bnb_config=str(p)).quant
    assert q.method == ("4bit" if theirs.load_in_4bit else "8bit")
    if theirs.load_in_4bit:
        assert (q.quant_type, q.double_quant) == (theirs.bnb_4bit_quant_type, theirs.bnb_4bit_use_double_quant)
        assert q.compute_dtype == _DTYPES[str(theirs.bnb_4bit_compute_dtype).removeprefix("torch.")]
        assert q.quant_storage == _DTYPES[str(theirs.bnb_4bit_quant_storage).removeprefix("torch.")]
