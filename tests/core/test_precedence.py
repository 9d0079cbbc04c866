"""The one precedence rule for every input (``memfit.core.inputs.precedence``; docs/inputs.md):
flags > scenario > TrainingArguments/SFTConfig > accelerate config > BitsAndBytesConfig > DeepSpeed
"auto" > defaults. Overrides are said; two files that disagree name both files and both values unless
transformers/accelerate settle it (then that is said); invalid values list the valid ones. The files
are written as users have them: ``accelerate config``'s YAML with every key it writes, TrainingArguments
and SFTConfig as JSON/YAML, a BitsAndBytesConfig as ``to_json_file`` writes it. (What transformers and
accelerate themselves do with the same files: tests/exact/test_precedence_against_libraries.py.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "robustness"))
from clirun import assert_one_line_error, cli  # noqa: E402
from memfit.core.inputs.precedence import Given, choose  # noqa: E402
from memfit.core.scenario.build import build_scenario  # noqa: E402
from memfit.core.scenario.inputs import ScenarioInputs  # noqa: E402
from memfit.core.scenario.read import read_scenario_file  # noqa: E402
from memfit.errors import MemfitError  # noqa: E402

ACCELERATE_FSDP = {  # what `accelerate config` writes for FSDP (accelerate 1.15), mixed_precision 'no'
    "compute_environment": "LOCAL_MACHINE", "debug": False, "distributed_type": "FSDP", "downcast_bf16": "no",
    "enable_cpu_affinity": False, "fsdp_config": {
        "fsdp_activation_checkpointing": False, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_cpu_ram_efficient_loading": True, "fsdp_offload_params": False, "fsdp_reshard_after_forward": True,
        "fsdp_state_dict_type": "SHARDED_STATE_DICT", "fsdp_version": 2},
    "machine_rank": 0, "main_training_function": "main", "mixed_precision": "no", "num_machines": 1,
    "num_processes": 2, "rdzv_backend": "static", "same_network": True, "tpu_env": [], "tpu_use_cluster": False,
    "tpu_use_sudo": False, "use_cpu": False}
ACCELERATE_MULTI_GPU = {**{k: v for k, v in ACCELERATE_FSDP.items() if k != "fsdp_config"},
                        "distributed_type": "MULTI_GPU", "mixed_precision": "fp16"}
DS_AUTO = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
           "train_batch_size": "auto", "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
           "fp16": {"enabled": "auto"}, "zero_optimization": {"stage": 2}}


def _write(tmp_path, name, data):
    p = tmp_path / name
    p.write_text(json.dumps(data) if name.endswith(".json") else yaml.safe_dump(data))
    return str(p)


def _plan(**kw):
    return build_scenario(ScenarioInputs(**{"model": "gpt2", **kw}))


# ------------------------------------------------------------------------------- the rule itself

def test_the_strongest_input_wins_and_overrides_are_said():
    notes: list[str] = []
    chosen = choose([Given("micro_batch", 4, "training_args", "ta.json: per_device_train_batch_size"),
                     Given("micro_batch", 1, "flag", "--micro-batch")], notes=notes)
    assert chosen.value == 1 and notes == ["--micro-batch = 1 overrides ta.json: per_device_train_batch_size = 4"]


def test_a_library_default_yields_without_a_note():
    notes: list[str] = []
    chosen = choose([Given("micro_batch", 8, "training_args", "ta.json: per_device_train_batch_size "
                           "(TrainingArguments default)", default=True),
                     Given("micro_batch", 2, "accelerate_config", "acc.yaml: x")], notes=notes)
    assert chosen.value == 2 and notes == []


def test_two_files_that_disagree_name_both_files_and_both_values():
    with pytest.raises(MemfitError, match=r"^ta.json: gradient_accumulation_steps = 2 contradicts "
                                          r"acc.yaml: deepspeed_config.gradient_accumulation_steps = 4$"):
        choose([Given("grad_accum", 4, "accelerate_config", "acc.yaml: deepspeed_config.gradient_accumulation_steps"),
                Given("grad_accum", 2, "training_args", "ta.json: gradient_accumulation_steps")])


# ---------------------------------------------------------------------- through the user's files

def test_flags_override_a_training_args_file(tmp_path):
    """Issue 23 item 2: --micro-batch 1 over per_device_train_batch_size 4 (was 'contradicts')."""
    ta = _write(tmp_path, "ta.json", {"output_dir": "out", "per_device_train_batch_size": 4,
                                      "gradient_checkpointing": True})
    r = cli("plan", "--model", "gpt2", "--training-args", ta, "--micro-batch", "1", "--json")
    assert r.rc == 0, r.err
    plan = json.loads(r.out)
    assert plan["scenario"]["micro_batch"] == 1 and plan["scenario"]["gradient_checkpointing"] is True
    assert any(n.startswith("--micro-batch = 1 overrides") and "per_device_train_batch_size = 4" in n
               for n in plan["notes"]), plan["notes"]


def test_the_scenario_overrides_its_training_args(tmp_path):
    ta = _write(tmp_path, "ta.json", {"output_dir": "out", "per_device_train_batch_size": 4})
    scn = _write(tmp_path, "run.yaml", {"model": "gpt2", "training_args": "ta.json", "train": {"micro_batch": 2}})
    sc = build_scenario(read_scenario_file(scn))
    assert sc.train.micro_batch == 2
    assert any("run.yaml: train.micro_batch = 2 overrides" in n and ta in n for n in sc.input_notes)


def test_a_bad_flag_value_is_invalid_not_a_contradiction(tmp_path):
    ta = _write(tmp_path, "ta.json", {"output_dir": "out", "per_device_train_batch_size": 4})
    assert_one_line_error(cli("plan", "--model", "gpt2", "--training-args", ta, "--precision", "fp8"),
                          "--precision", "invalid value 'fp8'; valid: fp32, amp_fp16, amp_bf16, fp16, bf16")


def test_training_args_bf16_wins_over_accelerate_no(tmp_path):
    """Issue 23 item 3: accelerate mixed_precision 'no' + TrainingArguments bf16: true is valid; transformers
    lets TrainingArguments win, and memfit says so."""
    acc = _write(tmp_path, "acc.yaml", ACCELERATE_FSDP)
    ta = _write(tmp_path, "ta.json", {"output_dir": "out", "bf16": True, "per_device_train_batch_size": 2})
    sc = _plan(gpus="2xa100-80gb", accelerate_config=acc, training_args=ta)
    assert sc.framework == "fsdp2" and sc.fsdp.mixed_precision == "bf16" and sc.torch.precision == "fp32"
    assert any("bf16 = true wins over" in n and "mixed_precision = 'no'" in n for n in sc.input_notes)


def test_accelerate_mixed_precision_stands_when_training_args_say_neither(tmp_path):
    acc = _write(tmp_path, "acc.yaml", ACCELERATE_MULTI_GPU)
    ta = _write(tmp_path, "ta.json", {"output_dir": "out"})
    sc = _plan(gpus="2xa100-80gb", accelerate_config=acc, training_args=ta)
    assert sc.framework == "ddp" and sc.torch.precision == "amp_fp16"


def test_training_args_deepspeed_wins_over_a_multi_gpu_launch_config(tmp_path):
    ds = _write(tmp_path, "ds.json", DS_AUTO)
    acc = _write(tmp_path, "acc.yaml", ACCELERATE_MULTI_GPU)
    ta = _write(tmp_path, "ta.json", {"output_dir": "out", "deepspeed": ds, "fp16": True,
                                      "per_device_train_batch_size": 2})
    sc = _plan(gpus="2xa100-80gb", accelerate_config=acc, training_args=ta)
    assert sc.framework == "deepspeed" and sc.deepspeed.precision == "fp16" and sc.train.micro_batch == 2
    assert any("wins over" in n and "distributed_type = 'ddp'" in n for n in sc.input_notes)


def test_training_args_with_a_deepspeed_key_plans(tmp_path):
    """Issue 23 item 1: {"deepspeed": "ds.json"} no longer 'contradicts optim': the Trainer's optim is the client
    optimizer DeepSpeed wraps (no optimizer section); micro batch, accumulation and precision fill "auto"."""
    ds = _write(tmp_path, "ds.json", DS_AUTO)
    ta = _write(tmp_path, "ta.json", {"deepspeed": ds})
    sc = _plan(gpus="1xa100-80gb", training_args=ta)
    assert sc.framework == "deepspeed" and sc.train.micro_batch == 8  # TrainingArguments' default
    assert sc.deepspeed.precision == "fp32"  # bf16/fp16 false: the Trainer fills "auto" with False
    assert sc.deepspeed.optimizer.type == "adamw" and not sc.deepspeed.optimizer.in_config
    assert any("client optimizer" in n for n in sc.input_notes)
    # the same split into --training-args and --deepspeed (was: "got 'amp_bf16'")
    ta2 = _write(tmp_path, "ta2.json", {"output_dir": "out", "bf16": True})
    sc2 = _plan(gpus="1xa100-80gb", training_args=ta2, deepspeed=ds)
    assert sc2.framework == "deepspeed" and sc2.deepspeed.precision == "bf16"


def test_a_written_deepspeed_value_the_training_args_contradict_is_the_trainers_mismatch(tmp_path):
    ds = _write(tmp_path, "ds.json", {**DS_AUTO, "train_micro_batch_size_per_gpu": 4})
    ta = _write(tmp_path, "ta.json", {"deepspeed": ds})
    with pytest.raises(MemfitError, match=r"train_micro_batch_size_per_gpu=4 vs .*ta.json: "
                                          r"per_device_train_batch_size \(TrainingArguments default\) 8"):
        _plan(training_args=ta)


def test_the_trainers_optimizer_under_deepspeed(tmp_path):
    ds_opt = _write(tmp_path, "opt.json", {**DS_AUTO, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}})
    ta = _write(tmp_path, "ta.json", {"deepspeed": ds_opt, "optim": "adafactor"})
    sc = _plan(training_args=ta)  # DeepSpeed builds the section's optimizer; the Trainer passes a DummyOptim
    assert sc.deepspeed.optimizer.in_config and any("is not used" in n and "adafactor" in n for n in sc.input_notes)
    ds = _write(tmp_path, "ds.json", DS_AUTO)
    ta = _write(tmp_path, "ta2.json", {"deepspeed": ds, "optim": "adafactor"})
    with pytest.raises(MemfitError, match="models a client torch AdamW only"):
        _plan(training_args=ta)
    off = _write(tmp_path, "off.json", {**DS_AUTO, "zero_optimization": {"stage": 2, "offload_optimizer": {
        "device": "cpu"}}})
    ta = _write(tmp_path, "ta3.json", {"deepspeed": off})
    with pytest.raises(MemfitError, match="zero_force_ds_cpu_optimizer"):
        _plan(training_args=ta)


def test_a_bnb_config_merges_key_by_key_with_the_scenarios_quantization(tmp_path):
    """Issue 23 item 3: a BitsAndBytesConfig JSON with quantization: {prepare_kbit: false} in the scenario."""
    bnb = _write(tmp_path, "bnb.json", {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                        "bnb_4bit_compute_dtype": "bfloat16", "quant_method": "bitsandbytes"})
    scn = _write(tmp_path, "run.yaml", {"model": "gpt2", "peft": "lora", "bnb_config": "bnb.json",
                                        "quantization": {"prepare_kbit": False}, "hardware": {"gpus": "1xrtx4090"}})
    sc = build_scenario(read_scenario_file(scn))
    assert (sc.quant.method, sc.quant.quant_type, sc.quant.compute_dtype, sc.quant.prepare_kbit) == (
        "4bit", "nf4", "bf16", False)
    scn2 = _write(tmp_path, "run2.yaml", {"model": "gpt2", "peft": "lora", "bnb_config": "bnb.json",
                                          "quantization": {"quant_type": "fp4"}})
    sc2 = build_scenario(read_scenario_file(scn2))
    assert sc2.quant.quant_type == "fp4" and any("overrides" in n and "bnb_4bit_quant_type" in n
                                                 for n in sc2.input_notes)


def test_gpus_flag_overrides_accelerate_num_processes(tmp_path):
    acc = _write(tmp_path, "acc.yaml", {**ACCELERATE_MULTI_GPU, "num_processes": 4})
    sc = _plan(gpus="2xa100-80gb", accelerate_config=acc)
    assert sc.world_size == 2 and any("overrides" in n and "num_processes = 4" in n for n in sc.input_notes)
    sc = _plan(accelerate_config=acc)  # no --gpus: the count from the file, the model assumed (and said)
    assert sc.world_size == 4 and any(a.what == "GPUs" and "a100-80gb" in a.value and "num_processes" in a.why
                                      for a in sc.assumptions)


def test_framework_flag_overrides_the_files(tmp_path):
    acc = _write(tmp_path, "acc.yaml", ACCELERATE_FSDP)
    sc = _plan(gpus="2xa100-80gb", accelerate_config=acc, framework="ddp")
    assert sc.framework == "ddp" and any("overrides" in n for n in sc.input_notes)
    assert any("is not used: the run trains with ddp" in n for n in sc.input_notes)


def test_use_cpu_plans_a_cpu_run(tmp_path):
    """Issue 24 item 8: use_cpu: true in TrainingArguments or accelerate gave a GPU plan."""
    ta = _write(tmp_path, "ta.json", {"output_dir": "out", "use_cpu": True})
    assert _plan(training_args=ta).accelerator == "cpu"
    acc = _write(tmp_path, "acc.yaml", {**ACCELERATE_MULTI_GPU, "distributed_type": "NO", "num_processes": 1,
                                        "use_cpu": True, "mixed_precision": "no"})
    assert _plan(accelerate_config=acc).accelerator == "cpu"


def test_max_seq_length_without_lengths_is_the_sequence_length():
    """Issue 24 item 8: --max-seq-length 64 without --lengths was ignored (the plan stayed at 2048)."""
    r = cli("plan", "--model", "gpt2", "--max-seq-length", "64", "--json")
    assert r.rc == 0, r.err
    assert json.loads(r.out)["scenario"]["seq_len"] == 64
    assert_one_line_error(cli("plan", "--model", "gpt2", "--max-seq-length", "64", "--seq-len", "128"),
                          "--max-seq-length")


def test_a_scenario_adapter_config_resolves_once(tmp_path):
    """Issue 23 item 4: peft: {adapter_config: PATH} was resolved relative to the folder twice."""
    sub = tmp_path / "cases"
    (sub / "adapter").mkdir(parents=True)
    (sub / "adapter" / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["c_attn"], "task_type": "CAUSAL_LM"}))
    scn = _write(sub, "run.yaml", {"model": "gpt2", "peft": {"adapter_config": "adapter/adapter_config.json"}})
    sc = build_scenario(read_scenario_file(scn))
    assert sc.peft.method == "lora" and sc.peft.lora_r == 4


def test_sizes_need_a_unit():
    """Issue 23 item 4: --cpu-ram 64 was taken as 64 bytes."""
    assert_one_line_error(cli("plan", "--model", "gpt2", "--cpu-ram", "64"), "'64' has no unit", "64GiB")
    r = cli("plan", "--model", "gpt2", "--cpu-ram", "64GiB", "--json")
    assert r.rc == 0 and json.loads(r.out)["scenario"]["cpu_ram_bytes"] == 64 * 2**30


def test_every_assumed_value_is_said_in_the_plan_and_its_json():
    """Issue 23 item 4: the defaults (an A100 80 GB, 256 GB of RAM) were applied without being said."""
    r = cli("plan", "--model", "gpt2", "--json")
    said = {(a["kind"], a["what"]): a for a in json.loads(r.out)["scenario"]["assumptions"]}
    assert said[("hardware", "GPUs")]["value"].startswith("1 x a100-80gb")
    assert said[("hardware", "host RAM")]["value"] == "256GB per node"
    assert said[("lengths", "sequence length")]["value"] == "2,048 tokens"
    assert {("stack", "torch"), ("stack", "DeepSpeed"), ("stack", "transformers"), ("defaults", "load dtype")} <= set(said)
    r = cli("plan", "--model", "gpt2", "--gpus", "1xrtx4090", "--cpu-ram", "64GB", "--seq-len", "512",
            "--torch-version", "2.13", "--json")
    whats = {a["what"] for a in json.loads(r.out)["scenario"]["assumptions"]}
    assert not {"GPUs", "host RAM", "sequence length", "torch"} & whats
    text = cli("plan", "--model", "gpt2").out
    assert "assumed (no input gave these" in text and "a100-80gb" in text


def test_training_args_defaults_are_listed_as_assumed(tmp_path):
    ta = _write(tmp_path, "ta.json", {"output_dir": "out"})
    sc = _plan(training_args=ta, gpus="1xa100-80gb")
    assumed = {a.what: a for a in sc.assumptions}
    assert assumed["micro batch"].value == "8" and "TrainingArguments default" in assumed["micro batch"].why


@pytest.mark.parametrize("transformers, given, accelerate, expected", [
    # 4.41+: TrainingArguments writes FSDP_CPU_RAM_EFFICIENT_LOADING from fsdp_config (default false),
    # over the launcher's (4.41.0 training_args.py:1864-1872)
    ("4.41", None, True, False), ("4.41", True, None, True), ("5.24", None, None, False),
    # up to 4.40 it does not read the key (4.36.0, 4.40.0): the launcher's value, else accelerate's false
    ("4.40", True, None, False), ("4.40", None, True, True), ("4.40", False, True, True),
])
def test_cpu_ram_efficient_loading_follows_the_release(tmp_path, transformers, given, accelerate, expected):
    fcfg = {"transformer_layer_cls_to_wrap": ["GPT2Block"]}
    if given is not None:
        fcfg["cpu_ram_efficient_loading"] = given
    ta = _write(tmp_path, "ta.json", {"output_dir": "out", "fsdp": "full_shard auto_wrap", "fsdp_config": fcfg,
                                      "per_device_train_batch_size": 2})
    kw = {}
    if accelerate is not None:
        acc = {**ACCELERATE_FSDP, "fsdp_config": {**ACCELERATE_FSDP["fsdp_config"],
                                                  "fsdp_cpu_ram_efficient_loading": accelerate, "fsdp_version": 1,
                                                  "fsdp_backward_prefetch": "NO_PREFETCH"}}
        kw["accelerate_config"] = _write(tmp_path, "acc.yaml", acc)
    sc = _plan(gpus="2xa100-80gb", training_args=ta, transformers_version=transformers, **kw)
    assert sc.fsdp.cpu_ram_efficient_loading is expected
    if transformers == "4.40":
        assert any("does not read fsdp_config.cpu_ram_efficient_loading" in n for n in sc.input_notes), sc.input_notes
