"""``use_cpu: true`` (what ``accelerate config`` writes on a machine without a GPU: accelerate's
``write_basic_config``, and the Trainer's ``TrainingArguments(use_cpu=True)``) makes a CPU run; next to
GPUs the user names too, the plan says so and where each came from."""

import json

from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.inputs import ScenarioInputs

ACCELERATE_CPU = """{
  "compute_environment": "LOCAL_MACHINE",
  "debug": false,
  "distributed_type": "NO",
  "downcast_bf16": false,
  "enable_cpu_affinity": false,
  "machine_rank": 0,
  "main_training_function": "main",
  "mixed_precision": "bf16",
  "num_machines": 1,
  "num_processes": 1,
  "rdzv_backend": "static",
  "same_network": false,
  "tpu_use_cluster": false,
  "tpu_use_sudo": false,
  "use_cpu": true
}
"""
"""accelerate 1.16's write_basic_config(mixed_precision="bf16") on this machine (no GPU), as written."""


def test_use_cpu_beside_named_gpus_is_said(tmp_path):
    acc = tmp_path / "default_config.yaml"
    acc.write_text(ACCELERATE_CPU)
    sc = build_scenario(ScenarioInputs(model="gpt2", gpus="1xa100-80gb", accelerate_config=str(acc)))
    assert sc.accelerator == "cpu"
    (w,) = [w for w in sc.input_warnings if "CPU run" in w]
    assert "default_config.yaml" in w and "use_cpu" in w and "1xa100-80gb" in w and "\n" not in w


def test_trainer_use_cpu_is_said_and_a_gpu_run_is_not(tmp_path):
    ta = tmp_path / "training_args.json"
    ta.write_text(json.dumps({"output_dir": "out", "per_device_train_batch_size": 2, "use_cpu": True}))
    sc = build_scenario(ScenarioInputs(model="gpt2", gpus="1xa100-80gb", training_args=str(ta)))
    assert any("use_cpu makes this a CPU run" in w for w in sc.input_warnings)
    ta.write_text(json.dumps({"output_dir": "out", "per_device_train_batch_size": 2, "use_cpu": False}))
    sc = build_scenario(ScenarioInputs(model="gpt2", gpus="1xa100-80gb", training_args=str(ta)))
    assert not any("CPU run" in w for w in sc.input_warnings)


def test_a_replay_cpu_accelerator_is_not_a_user_cpu_run():
    sc = build_scenario(ScenarioInputs(model="gpt2", gpus="2xa100-80gb", accelerator="cpu"))
    assert not any("CPU run" in w for w in sc.input_warnings)
