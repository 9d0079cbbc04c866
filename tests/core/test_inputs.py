"""The input files people already have (``memfit.core.inputs``): TrainingArguments / SFTConfig,
BitsAndBytesConfig, accelerate config; their defaults, the framework they imply, and one-line errors
naming both sides of a contradiction. (tests/exact/test_inputs_against_libraries.py reads the same
files with transformers and accelerate.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.inputs import ScenarioInputs
from memfit.errors import MemfitError


def _write(tmp_path, name, data):
    p = tmp_path / name
    if name.endswith(".json"):
        p.write_text(json.dumps(data))
    else:
        import yaml

        p.write_text(yaml.safe_dump(data))
    return str(p)


def test_sftconfig_defaults_and_keys(tmp_path):
    sft = _write(tmp_path, "sft.json", {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 8,
                                        "max_length": 2048, "packing": True, "optim": "paged_adamw_8bit",
                                        "learning_rate": 2e-4, "model_init_kwargs": {"torch_dtype": "bfloat16"}})
    sc = build_scenario(ScenarioInputs(model="gpt2", peft_method="lora", gpus="1xrtx4090", training_args=sft))
    assert sc.framework == "torch"
    assert (sc.train.micro_batch, sc.train.seq_len, sc.train.gradient_checkpointing) == (2, 2048, True)
    assert (sc.torch.gradient_accumulation_steps, sc.torch.optim, sc.torch.precision) == (8, "paged_adamw_8bit", "amp_bf16")
    assert sc.load.dtype == "bf16"
    assert any("SFTConfig" in n and "learning_rate" in n for n in sc.input_notes)


def test_training_arguments_defaults(tmp_path):
    ta = _write(tmp_path, "args.yaml", {"output_dir": "x", "fp16": True})
    sc = build_scenario(ScenarioInputs(model="gpt2", gpus="1xt4", training_args=ta))
    assert (sc.train.micro_batch, sc.torch.optim, sc.torch.precision, sc.train.gradient_checkpointing) == (
        8, "adamw_torch_fused", "amp_fp16", False)


def test_fsdp_in_training_arguments(tmp_path):
    ta = _write(tmp_path, "args.json", {"fsdp": "full_shard auto_wrap offload", "bf16": True,
                                        "fsdp_config": {"fsdp_version": 2, "cpu_ram_efficient_loading": True}})
    sc = build_scenario(ScenarioInputs(model="gpt2", gpus="4xa100-80gb", training_args=ta))
    assert sc.framework == "fsdp2"
    assert (sc.fsdp.sharding_strategy, sc.fsdp.cpu_offload, sc.fsdp.mixed_precision, sc.torch.precision) == (
        "FULL_SHARD", True, "bf16", "fp32")


def test_ddp_trainer_find_unused(tmp_path):
    ta = _write(tmp_path, "args.json", {"ddp_bucket_cap_mb": 50})
    lora = build_scenario(ScenarioInputs(model="gpt2", peft_method="lora", gpus="2xa100-80gb", training_args=ta))
    full = build_scenario(ScenarioInputs(model="gpt2", gpus="2xa100-80gb", training_args=ta, gradient_checkpointing=True))
    assert lora.framework == "ddp" and lora.ddp.find_unused_parameters and lora.ddp.bucket_cap_mb == 50
    assert not full.ddp.find_unused_parameters  # the Trainer: not gradient_checkpointing for a transformers model


def test_accelerate_fsdp_config(tmp_path):
    acc = _write(tmp_path, "acc.yaml", {"distributed_type": "FSDP", "mixed_precision": "bf16", "num_processes": 8,
                                        "num_machines": 1, "fsdp_config": {
                                            "fsdp_version": 2, "fsdp_offload_params": True,
                                            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                                            "fsdp_activation_checkpointing": True}})
    sc = build_scenario(ScenarioInputs(model="gpt2", gpus="8xa100-80gb", accelerate_config=acc))
    assert sc.framework == "fsdp2" and sc.fsdp.cpu_offload and sc.fsdp.mixed_precision == "bf16"
    assert sc.train.gradient_checkpointing and sc.world_size == 8


def test_accelerate_deepspeed_inline(tmp_path):
    acc = _write(tmp_path, "acc.yaml", {"distributed_type": "DEEPSPEED", "mixed_precision": "bf16",
                                        "num_processes": 2, "deepspeed_config": {
                                            "zero_stage": 3, "offload_optimizer_device": "cpu"}})
    sc = build_scenario(ScenarioInputs(model="gpt2", gpus="2xa100-80gb", accelerate_config=acc))
    assert sc.framework == "deepspeed" and sc.deepspeed.zero.stage == 3
    assert sc.deepspeed.zero.offload_optimizer.device == "cpu" and sc.deepspeed.precision == "bf16"


def test_bnb_config(tmp_path):
    b = _write(tmp_path, "bnb.json", {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                      "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "bfloat16",
                                      "bnb_4bit_quant_storage": "bfloat16"})
    sc = build_scenario(ScenarioInputs(model="gpt2", peft_method="lora", gpus="1xrtx4090", bnb_config=b))
    assert sc.framework == "torch"
    q = sc.quant
    assert (q.method, q.quant_type, q.double_quant, q.compute_dtype, q.quant_storage) == ("4bit", "nf4", True, "bf16", "bf16")
    cfg = _write(tmp_path, "config.json", {"quantization_config": {"load_in_8bit": True}})
    assert build_scenario(ScenarioInputs(model="gpt2", peft_method="lora", bnb_config=cfg,
                                         gpus="1xrtx4090")).quant.method == "8bit"


@pytest.mark.parametrize("files,kw,match", [
    ({"training_args": {"deepspeed": "ds.json"}, "accelerate_config": {"distributed_type": "FSDP", "num_processes": 2}},
     {"gpus": "2xa100-80gb"}, r"ta.json: deepspeed = 'deepspeed' contradicts .*acc.yaml: distributed_type = 'fsdp'"),
    ({"training_args": {"gradient_accumulation_steps": 2}, "accelerate_config": {
        "distributed_type": "DEEPSPEED", "num_processes": 1, "deepspeed_config": {"gradient_accumulation_steps": 4}}},
     {}, r"gradient_accumulation_steps=4 vs .*ta.json: gradient_accumulation_steps 2"),
    ({"bnb_config": {"load_in_4bit": True}}, {"peft_method": "full"}, "fully fine-tuned"),
    ({"training_args": {"bf16": True, "fp16": True}}, {}, "both true"),
    ({"training_args": {"optim": "galore_adamw"}}, {}, "invalid value 'galore_adamw'"),
    ({"bnb_config": {"load_in_4bit": True, "load_in_8bit": True}}, {"peft_method": "lora"}, "both true"),
])
def test_contradictions_name_both_sides(tmp_path, files, kw, match):
    inputs = {}
    for key, data in files.items():
        inputs[key] = _write(tmp_path, {"training_args": "ta.json", "accelerate_config": "acc.yaml",
                                        "bnb_config": "bnb.json"}[key], data)
    kw = {"model": "gpt2", "gpus": "1xa100-80gb", **kw, **inputs}
    with pytest.raises(MemfitError, match=match):
        build_scenario(ScenarioInputs(**kw))


def test_yaml_is_parsed_safely(tmp_path):
    evil = tmp_path / "acc.yaml"
    evil.write_text("distributed_type: !!python/object/apply:os.system ['echo pwned']\n")
    r = subprocess.run([sys.executable, "-m", "memfit.cli", "plan", "--model", "gpt2", "--accelerate-config", str(evil)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "pwned" not in r.stdout + r.stderr and r.stderr.count("\n") == 1, r.stderr


@pytest.mark.parametrize("data,flag", [({"distributed_type": "FSDP", "num_processes": 8}, "--accelerate-config"),
                                       ({"output_dir": "out", "per_device_train_batch_size": 2}, "--training-args")])
def test_an_input_file_given_as_the_scenario_says_which_flag_it_needs(tmp_path, data, flag):
    from memfit.core.scenario.read import read_scenario_file

    path = _write(tmp_path, "x.yaml", data)
    with pytest.raises(MemfitError, match=flag):
        read_scenario_file(path)


def test_quantization_under_deepspeed_is_planned_not_ignored(tmp_path):
    from pathlib import Path

    from memfit.core.plan import make_plan

    ds = Path(__file__).resolve().parents[2] / "examples" / "deepspeed" / "zero2_bf16.json"
    bnb = _write(tmp_path, "bnb.json", {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"})
    sc = build_scenario(ScenarioInputs(model="gpt2", peft_method="lora", deepspeed=str(ds), bnb_config=bnb))
    keys = {i.key for p in make_plan(sc).phases for i in p.items}
    assert "quant.state" in keys  # the quantization state, on the GPU from the load on
    eight = _write(tmp_path, "bnb8.json", {"load_in_8bit": True})
    with pytest.raises(MemfitError, match="8-bit .LLM.int8... under DeepSpeed is not modelled"):
        build_scenario(ScenarioInputs(model="gpt2", peft_method="lora", deepspeed=str(ds), bnb_config=eight))


@pytest.mark.parametrize("sft,rule,seq", [({"max_length": 512, "packing": True}, "pack", 512),
                                         ({"max_length": 300}, "pad-longest", 300),
                                         ({"max_length": 4096, "group_by_length": True}, "bucket", 700)])
def test_training_args_with_a_length_distribution(tmp_path, sft, rule, seq):
    """With --lengths the SFTConfig's max_length truncates the samples (max_seq_length) and its
    packing / group_by_length choose the batching rule; the plan takes the largest batch."""
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(str(n) for n in (120, 300, 450, 700, 90)) + "\n")
    ta = _write(tmp_path, "sft.json", {"per_device_train_batch_size": 2, **sft, "dataset_text_field": "text"})
    sc = build_scenario(ScenarioInputs(model="gpt2", gpus="1xa100-80gb", training_args=ta, lengths=str(lengths)))
    assert sc.train.batch_shape.rule == rule and sc.train.seq_len == seq
