"""memfit's readers of TrainingArguments, BitsAndBytesConfig and accelerate config files against the
libraries reading the same files: transformers' ``TrainingArguments``/``BitsAndBytesConfig`` built
from them, accelerate's ``load_config_from_file``; memfit's settings must be theirs."""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

TRAINING_ARGS = [
    {"output_dir": "o", "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "bf16": True,
     "optim": "adafactor", "gradient_checkpointing": True, "max_grad_norm": 0.3, "weight_decay": 0.01},
    {"output_dir": "o", "optim": "paged_adamw_8bit", "fp16": True},
    {"output_dir": "o"},
    {"output_dir": "o", "optim": "sgd", "optim_args": "momentum=0.9", "per_device_train_batch_size": 1},
]


@pytest.mark.parametrize("raw", TRAINING_ARGS)
def test_training_arguments_match_transformers(tmp_path, raw):
    from memfit.core.inputs.training_args import read_training_args

    p = tmp_path / "args.json"
    p.write_text(json.dumps(raw))
    mine = read_training_args(str(p)).values
    args = transformers.TrainingArguments(**{**raw, "use_cpu": True, "report_to": []})
    assert mine["micro_batch"] == args.per_device_train_batch_size
    assert mine["grad_accum"] == args.gradient_accumulation_steps
    assert mine["optim"] == str(getattr(args.optim, "value", args.optim))
    assert mine["mixed_precision"] == ("bf16" if args.bf16 else "fp16" if args.fp16 else "no")
    assert mine["gradient_checkpointing"] == bool(args.gradient_checkpointing)
    assert mine.get("max_grad_norm", 1.0) == args.max_grad_norm
    assert mine.get("weight_decay", 0.0) == args.weight_decay


BNB = [
    {"load_in_4bit": True},
    {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
     "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_storage": "bfloat16"},
    {"load_in_8bit": True, "llm_int8_skip_modules": ["lm_head", "mlp.gate"]},
]


@pytest.mark.parametrize("raw", BNB)
def test_bnb_config_matches_transformers(tmp_path, raw):
    from memfit.core.inputs.bnb_config import read_bnb_config

    p = tmp_path / "bnb.json"
    cfg = transformers.BitsAndBytesConfig(**raw)
    cfg.to_json_file(str(p))  # what a user saves
    mine = _mapping(read_bnb_config(str(p)).values, "quantization")
    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.uint8: "uint8"}
    assert mine["method"] == ("4bit" if cfg.load_in_4bit else "8bit")
    if cfg.load_in_4bit:
        assert mine["quant_type"] == cfg.bnb_4bit_quant_type
        assert mine["double_quant"] == cfg.bnb_4bit_use_double_quant
        assert mine["compute_dtype"] == names[cfg.bnb_4bit_compute_dtype]
        assert mine["quant_storage"] == names[cfg.bnb_4bit_quant_storage]
    assert tuple(mine.get("skip_modules", ())) == tuple(cfg.llm_int8_skip_modules or ())


ACCELERATE = [
    {"compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP", "mixed_precision": "bf16",
     "num_machines": 1, "num_processes": 8, "machine_rank": 0, "main_training_function": "main",
     "fsdp_config": {"fsdp_version": 2, "fsdp_offload_params": True, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                     "fsdp_cpu_ram_efficient_loading": True, "fsdp_reshard_after_forward": True}},
    {"compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU", "mixed_precision": "fp16",
     "num_machines": 2, "num_processes": 16, "machine_rank": 0, "main_training_function": "main"},
    # no fsdp_version: accelerate's FullyShardedDataParallelPlugin decides (FSDP_VERSION unset)
    {"compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP", "mixed_precision": "no",
     "num_machines": 1, "num_processes": 2, "machine_rank": 0, "main_training_function": "main",
     "fsdp_config": {"fsdp_offload_params": False, "fsdp_cpu_ram_efficient_loading": False,
                     "fsdp_sharding_strategy": "SHARD_GRAD_OP"}},
]


@pytest.mark.parametrize("raw", ACCELERATE)
def test_accelerate_config_matches_accelerate(tmp_path, raw, monkeypatch):
    pytest.importorskip("accelerate")
    import yaml
    from accelerate.commands.config.config_args import load_config_from_file

    from memfit.core.inputs.accelerate_config import read_accelerate_config

    p = tmp_path / "acc.yaml"
    p.write_text(yaml.safe_dump(raw))
    theirs = load_config_from_file(str(p))
    mine = read_accelerate_config(str(p)).values
    assert mine["gpus_count"] * mine["nodes"] == theirs.num_processes and mine["nodes"] == theirs.num_machines
    assert mine["mixed_precision"] == str(getattr(theirs.mixed_precision, "value", theirs.mixed_precision)).lower()
    dt = str(getattr(theirs.distributed_type, "value", theirs.distributed_type))
    version = theirs.fsdp_config.get("fsdp_version") if dt == "FSDP" else None
    if dt == "FSDP" and version is None:
        from accelerate.utils import FullyShardedDataParallelPlugin

        monkeypatch.delenv("FSDP_VERSION", raising=False)
        version = FullyShardedDataParallelPlugin().fsdp_version
    assert mine["framework"] == {"MULTI_GPU": "ddp", "FSDP": "fsdp2" if version == 2 else "fsdp"}[dt]
    if dt == "FSDP":
        fc = theirs.fsdp_config
        fsdp = _mapping(mine, "fsdp")
        assert fsdp["cpu_offload"] == bool(fc["fsdp_offload_params"])
        assert fsdp["cpu_ram_efficient_loading"] == bool(fc["fsdp_cpu_ram_efficient_loading"])


def _mapping(values: dict, name: str) -> dict:
    """The ``<name>.<key>`` settings a reader gives, as one mapping."""
    return {k.split(".", 1)[1]: v for k, v in values.items() if k.startswith(name + ".")}
