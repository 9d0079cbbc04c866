"""Issue 24's reproductions for the user's input files (items 1, 3, 4, 8), each as the user's file: one
line and exit status 2, or the right answer. (Their time and memory, measured once: every one answers
in under 2 s and 30 MB here; tests never assert elapsed time.)"""  # time-ok: a docstring, it times nothing

from __future__ import annotations

import json

import pytest
import yaml

from clirun import assert_one_line_error, cli

CYCLE = "model: gpt2\nname: &a [*a]\n"


@pytest.mark.parametrize("flag", ["scenario", "--accelerate-config", "--training-args"])
def test_a_self_referencing_yaml_alias_is_refused(tmp_path, flag):
    """Item 1: a 24-byte YAML whose alias contains itself hung memfit with unbounded memory."""
    p = tmp_path / "a.yaml"
    p.write_text(CYCLE)
    args = [str(p)] if flag == "scenario" else ["--model", "gpt2", flag, str(p)]
    assert_one_line_error(cli("plan", *args), "a YAML alias refers to a node that contains it")


def test_a_5000_digit_number_in_yaml_is_one_plain_line(tmp_path):
    """Python's int-digit limit (4,300) stops a 5,000-digit YAML integer; the line says so in the user's
    terms, not with Python's advice to call sys.set_int_max_str_digits()."""
    p = tmp_path / "a.yaml"
    p.write_text("model: gpt2\nmicro_batch: " + "9" * 5000 + "\n")
    r = cli("plan", str(p))
    assert_one_line_error(r, "a number of 5000 digits (more than 4,300)")
    assert "sys.set_int_max_str_digits" not in r.err


ACCELERATE = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP", "mixed_precision": "bf16",
              "num_machines": 1, "num_processes": 2, "machine_rank": 0, "main_training_function": "main",
              "fsdp_config": {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                              "fsdp_cpu_ram_efficient_loading": True}}


@pytest.mark.parametrize("typo,meant,config", [
    ("fsdp_ofload_params", "fsdp_offload_params", "fsdp_config"),
    ("offload_optimiser_device", "offload_optimizer_device", "deepspeed_config"),
])
def test_a_misspelled_accelerate_key_is_a_warning_with_the_key_meant(tmp_path, typo, meant, config):
    """Item 3: misspelled accelerate keys were dropped silently (accelerate launch drops them too: the plan
    is made without them, and says so, as a DeepSpeed JSON's typo is)."""
    acc = dict(ACCELERATE)
    if config == "deepspeed_config":
        acc = {**{k: v for k, v in acc.items() if k != "fsdp_config"}, "distributed_type": "DEEPSPEED",
               "deepspeed_config": {"zero_stage": 2}}
    without = tmp_path / "without.yaml"
    without.write_text(yaml.safe_dump(acc))
    acc[config] = {**acc[config], typo: True if config == "fsdp_config" else "cpu"}
    with_typo = tmp_path / "acc.yaml"
    with_typo.write_text(yaml.safe_dump(acc))
    base = ["plan", "--model", "llama-2-7b", "--gpus", "2xa100-80gb", "--json"]
    r = cli(*base, "--accelerate-config", str(with_typo))
    assert r.rc == 0, r.err
    warned = [ln for ln in r.err.splitlines() if ln.startswith("memfit: warning:")]
    assert any(repr(typo) in ln and f"did you mean {meant!r}" in ln for ln in warned), r.err
    doc = json.loads(r.out)
    assert any(f["id"] == "input-file-ignored" and typo in f["message"] for f in doc["findings"])
    clean = json.loads(cli(*base, "--accelerate-config", str(without)).out)
    assert [p["gpu_oom_relevant_bytes"] for p in doc["phases"]] == [p["gpu_oom_relevant_bytes"] for p in clean["phases"]]


@pytest.mark.parametrize("kind,data,fragment", [
    ("--training-args", {"weight_decay": "x"}, "weight_decay: invalid value 'x'"),
    ("--training-args", {"num_train_epochs": {}}, "num_train_epochs: invalid value {}; valid: a number"),
    ("--training-args", {"push_to_hub": "no thanks"}, "push_to_hub: invalid value 'no thanks'; valid: true or false"),
    ("--training-args", {"seed": 1.5}, "seed: invalid value 1.5; valid: a whole number"),
    ("--training-args", {"per_device_train_batch_size": "9" * 400}, "per_device_train_batch_size: invalid value"),
    ("--training-args", {"gradient_accumulation_steps": {}}, "gradient_accumulation_steps: invalid value {}"),
    ("--training-args", {"fsdp": "full_shard", "fsdp_config": [1]}, "fsdp_config: invalid value [1]"),
    ("--training-args", {"model_init_kwargs": 3}, "model_init_kwargs: invalid value 3"),
    ("--training-args", {"max_grad_norm": -1}, "max_grad_norm: invalid value -1"),
    ("--training-args", {"optim_args": {"momentum": 1}}, "optim_args: invalid value"),
    ("--training-args", {"per_device_train_batch_sise": 2}, "did you mean 'per_device_train_batch_size'"),
    ("--accelerate-config", {"distributed_type": "MULTI_GPU", "num_processes": 2, "num_machines": 0},
     "num_machines: invalid value 0"),
    ("--accelerate-config", {"distributed_type": "MULTI_GPU", "num_processes": "two"}, "num_processes: invalid value"),
    ("--accelerate-config", {"distributed_type": "FSDP", "num_processes": 2, "fsdp_config": "x"},
     "fsdp_config: invalid value 'x'"),
    ("--accelerate-config", {"distributed_type": "FSDP", "num_processes": 2, "fsdp_config": {
        "fsdp_sharding_strategy": "HALF_SHARD"}}, "valid: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD"),
    ("--accelerate-config", {"distributed_type": "TPU"}, "distributed_type: invalid value 'TPU'; valid: NO"),
    ("--accelerate-config", {"distributed_type": "XLA"}, "XLA is not modelled"),
    ("--accelerate-config", {"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 7}},
     "zero_stage: invalid value 7"),
    ("--accelerate-config", {"mixed_precison": "bf16"}, "did you mean 'mixed_precision'"),
    ("--bnb-config", {"load_in_4bit": True, "llm_int8_skip_modules": 5}, "llm_int8_skip_modules: invalid value 5"),
    ("--bnb-config", {"load_in_4bit": True, "bnb_4bit_compute_dtype": "float8"}, "bnb_4bit_compute_dtype: invalid"),
    ("--bnb-config", {"load_in_4bit": "yes please"}, "load_in_4bit: invalid value"),
    ("--bnb-config", {"quantization_config": 3}, "quantization_config: invalid value 3"),
])
def test_a_wrong_type_or_value_is_one_line(tmp_path, kind, data, fragment):
    """Item 4: a bare float()/int(), .items() on a non-dict, num_machines: 0 (ZeroDivisionError),
    llm_int8_skip_modules: 5: each was a traceback."""
    name = {"--training-args": "ta.json", "--accelerate-config": "acc.yaml", "--bnb-config": "bnb.json"}[kind]
    p = tmp_path / name
    p.write_text(json.dumps(data) if name.endswith(".json") else yaml.safe_dump(data))
    assert_one_line_error(cli("plan", "--model", "gpt2", "--peft", "lora", "--gpus", "2xa100-80gb", kind, str(p)),
                          fragment)


def test_a_training_args_key_memfit_ignores_is_named(tmp_path):
    """A key that changes no memory, of the type transformers gives it, is read as such and named (of a
    wrong type, ``{"num_train_epochs": {}}``, it is refused above: the Trainer would fail on it mid-run)."""
    p = tmp_path / "ta.json"
    # numbers as strings too, as argparse converts a string default (TRL's YAML config; PyYAML reads 2e-5 as one)
    p.write_text(json.dumps({"num_train_epochs": "3", "learning_rate": "2e-5", "output_dir": "o"}))
    r = cli("plan", "--model", "gpt2", "--training-args", str(p), "--json")
    assert r.rc == 0, r.err
    assert any("num_train_epochs" in n and "change no memory" in n for n in json.loads(r.out)["notes"])


@pytest.mark.parametrize("text,fragment", [
    ("9" * 400 + "\n", "a value of 402 characters is not a token count"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    (json.dumps({"lengths": [10, "9" * 400]}), "is not a token count"),
    (json.dumps({"128": 10**30}), "is not a count from 0"),
    ("100,-3\n", "is not a count"),
    ("12.5\n", "is not a token count"),
])
def test_a_hostile_lengths_file_is_one_line(tmp_path, text, fragment):
    """Item 4: a 400-digit length and a lengths JSON nested 100,000 deep were tracebacks."""
    p = tmp_path / ("lengths.json" if text.lstrip().startswith(("[", "{")) else "lengths.txt")
    p.write_text(text)
    assert_one_line_error(cli("plan", "--model", "gpt2", "--lengths", str(p)), fragment)
