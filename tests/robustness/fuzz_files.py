"""Seeded generator of the user's own input files (TrainingArguments/SFTConfig, accelerate config,
BitsAndBytesConfig, lengths files) and the properties every one must keep.

``case(seed)`` writes one scenario's files: half the seeds "clean" (what the libraries write and users
keep), half "dirty" (wrong types, huge, negative and non-finite numbers, misspelled and unknown keys,
400-digit numbers, deep nesting, YAML alias cycles). ``check(case, workdir)`` plans it and returns what
went wrong, if anything:

- anything raised other than a one-line ``MemfitError``;
- a byte figure in the plan's JSON that is negative, NaN or not an integer;
- a key of a file that the plan neither reads (a key the library has), nor warns about: an unknown
  key must be refused (TrainingArguments, accelerate's top level: the libraries refuse them) or be a
  warning (accelerate's fsdp_config/deepspeed_config, BitsAndBytesConfig: the libraries drop them);
  a key read but not modelled, set, must be a warning;
- a plan that takes over ``SLOW_S``.

tests/robustness/test_fuzz_files.py runs 2,000 seeds in every test run and 10,000 behind ``slow``.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fuzz_inputs import JUNK, _byte_problems, _typo
from memfit.core.inputs.keys import (ACCELERATE_DEEPSPEED_KEYS, ACCELERATE_FSDP_KEYS, ACCELERATE_KEYS, BNB_CONFIG_KEYS,
                                     LEGACY_SFT_KEYS, LEGACY_TRAINING_ARGS_KEYS, SEQ2SEQ_TRAINING_ARGS_KEYS,
                                     SFT_CONFIG_KEYS, TRAINING_ARGS_KEYS)
from memfit.core.inputs.training_args import NOT_MODELLED
from memfit.errors import MemfitError

SLOW_S = 2.0
"""A plan of a tiny model takes ~20 ms; one over 2 s means an input that should have been capped."""

BIG = (10**400, -(10**400), "9" * 400, 2**64, 1e308)

TA_VALUES: dict[str, list[Any]] = {
    "per_device_train_batch_size": [1, 2, 4, 8], "gradient_accumulation_steps": [1, 2, 4],
    "gradient_checkpointing": [True, False], "activation_checkpointing": [True, False], "bf16": [True, False],
    "fp16": [True, False], "optim": ["adamw_torch", "adamw_torch_fused", "adafactor", "sgd", "paged_adamw_8bit"],
    "optim_args": ["momentum=0.9", "beta1=0.9"], "weight_decay": [0.0, 0.01], "max_grad_norm": [1.0, 0.3, 0],
    "ddp_find_unused_parameters": [True, False], "ddp_bucket_cap_mb": [25, 50], "ddp_static_graph": [True, False],
    "max_length": [16, 64, 128], "max_seq_length": [32, 128], "packing": [True, False],
    "model_init_kwargs": [{"torch_dtype": "bfloat16"}, {"dtype": "float32"}, {}],
    "use_cpu": [False, False, True], "group_by_length": [True, False],
    "train_sampling_strategy": ["random", "group_by_length"], "torch_compile": [False, True],
    "output_dir": ["out"], "learning_rate": [2e-4, 1e-5], "num_train_epochs": [1, 3], "logging_steps": [10],
    "report_to": ["none", []], "seed": [42], "eval_strategy": ["no", "steps"], "evaluation_strategy": ["epoch"],
    "dataset_text_field": ["text"], "lr_scheduler_type": ["cosine"], "warmup_steps": [0, 100],
    "fsdp": ["full_shard auto_wrap", "shard_grad_op", "full_shard offload auto_wrap"],
    "fsdp_config": [{"fsdp_version": 2}, {"version": 1, "backward_prefetch": "backward_pre"},
                    {"activation_checkpointing": True, "cpu_ram_efficient_loading": True}],
    "use_liger_kernel": [False, True], "padding_free": [False, True],
}
ACC_FSDP_VALUES: dict[str, list[Any]] = {
    "fsdp_version": [1, 2], "fsdp_offload_params": [True, False], "fsdp_sharding_strategy": ["FULL_SHARD", 2, "NO_SHARD"],
    "fsdp_reshard_after_forward": [True, False], "fsdp_auto_wrap_policy": ["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP"],
    "fsdp_min_num_params": [100000], "fsdp_cpu_ram_efficient_loading": [True, False],
    "fsdp_backward_prefetch": ["BACKWARD_PRE", "NO_PREFETCH"], "fsdp_forward_prefetch": [False],
    "fsdp_use_orig_params": [True, False], "fsdp_activation_checkpointing": [True, False],
    "fsdp_state_dict_type": ["SHARDED_STATE_DICT"], "fsdp_sync_module_states": [True],
}
ACC_DS_VALUES: dict[str, list[Any]] = {
    "zero_stage": [0, 1, 2, 3], "offload_optimizer_device": ["none", "cpu"], "offload_param_device": ["none", "cpu"],
    "gradient_accumulation_steps": [1, 2], "gradient_clipping": [1.0], "zero3_init_flag": [True, False],
    "zero3_save_16bit_model": [True], "deepspeed_multinode_launcher": ["standard"],
}
BNB_VALUES: dict[str, list[Any]] = {
    "load_in_4bit": [True], "load_in_8bit": [False], "bnb_4bit_quant_type": ["nf4", "fp4"],
    "bnb_4bit_use_double_quant": [True, False], "bnb_4bit_compute_dtype": ["bfloat16", "float16", "float32"],
    "bnb_4bit_quant_storage": ["uint8", "bfloat16"], "llm_int8_threshold": [6.0],
    "llm_int8_skip_modules": [None, ["lm_head"]], "llm_int8_has_fp16_weight": [False],
    "llm_int8_enable_fp32_cpu_offload": [False], "quant_method": ["bitsandbytes"],
}


class _Rng(random.Random):
    dirty = False

    def junk(self, p: float) -> bool:
        return self.dirty and self.random() < p

    def value(self, choices: list[Any]) -> Any:
        if self.junk(0.12):
            return self.choice(JUNK + BIG + ({"a": [1]}, [[[]]]))
        return self.choice(choices)


def _pick(rng: _Rng, table: dict[str, list[Any]], p: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, choices in table.items():
        if rng.random() < p:
            name = _typo(rng, key) if rng.junk(0.06) else key
            out[name] = rng.value(choices)
    if rng.junk(0.1):
        out[rng.choice(["my_key", "per_device_batch_size", "fsdp_ofload_params", "offload_optimiser_device"])] = 1
    return out


@dataclass(frozen=True)
class Case:
    seed: int
    model_config: dict
    inputs: dict
    files: dict = field(default_factory=dict)
    """``{"training_args" | "accelerate_config" | "bnb_config" | "lengths": (file name, data or text)}``."""


def case(seed: int) -> Case:
    rng = _Rng(seed)
    rng.dirty = seed % 2 == 1
    heads = rng.choice([2, 4])
    model = {"model_type": "llama", "vocab_size": 64, "hidden_size": 8 * heads, "intermediate_size": 24,
             "num_hidden_layers": 1, "num_attention_heads": heads, "num_key_value_heads": rng.choice([1, heads])}
    world = rng.choice([1, 1, 2, 4])
    inputs: dict[str, Any] = {"gpus": f"{world}x{rng.choice(['a100-80gb', 'rtx4090', '24GiB'])}",
                              "peft_method": rng.choice(["lora", "lora", "full"]), "seq_len": rng.choice([None, 32]),
                              "cpu_ram": rng.choice([None, "64GiB"])}
    files: dict[str, tuple[str, Any]] = {}
    if rng.random() < 0.7:
        ta = _pick(rng, TA_VALUES, 0.25)
        if "fsdp" not in ta:
            ta.pop("fsdp_config", None)
        if rng.random() < 0.15:
            ta["deepspeed"] = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                               "zero_optimization": {"stage": rng.choice([0, 2, 3])},
                               "bf16": {"enabled": rng.choice(["auto", True])}}
        files["training_args"] = ("ta." + rng.choice(["json", "yaml"]), ta)
    if rng.random() < 0.5:
        acc: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE",
                               "distributed_type": rng.value(["NO", "MULTI_GPU", "FSDP", "DEEPSPEED"]),
                               "num_processes": rng.value([world, world, 2]), "num_machines": rng.value([1, 1, 2]),
                               "mixed_precision": rng.value(["no", "bf16", "fp16"]), "machine_rank": 0,
                               "main_training_function": "main", "use_cpu": rng.value([False, False, True])}
        if acc["distributed_type"] == "FSDP" or rng.junk(0.2):
            acc["fsdp_config"] = _pick(rng, ACC_FSDP_VALUES, 0.4)
        if acc["distributed_type"] == "DEEPSPEED" or rng.junk(0.2):
            acc["deepspeed_config"] = _pick(rng, ACC_DS_VALUES, 0.5)
        if rng.junk(0.1):
            acc[_typo(rng, "mixed_precision")] = "bf16"
        files["accelerate_config"] = ("acc.yaml", acc)
    if rng.random() < 0.3:
        bnb = _pick(rng, BNB_VALUES, 0.6)
        bnb.setdefault("load_in_4bit", True)
        files["bnb_config"] = ("bnb.json", {"quantization_config": bnb} if rng.random() < 0.2 else bnb)
    if rng.random() < 0.3:
        files["lengths"] = _lengths(rng)
        inputs["seq_len"] = None
        if rng.random() < 0.5:
            inputs["batching"] = rng.choice(["pad-longest", "bucket", "pack"])
            inputs["max_seq_length"] = rng.choice([None, 64])
    if rng.junk(0.04):  # an alias cycle, in whichever YAML file there is
        for kind, (name, data) in list(files.items()):
            if name.endswith(".yaml"):
                files[kind] = (name, "model: x\nname: &a [*a]\n")
    return Case(seed=seed, model_config=model, inputs=inputs, files=files)


def _lengths(rng: _Rng) -> tuple[str, str]:
    counts = [rng.randint(1, 200) for _ in range(rng.randint(1, 50))]
    if rng.junk(0.3):
        counts[rng.randrange(len(counts))] = rng.choice(["9" * 400, -5, 0, "x", 1.5, 10**30, ""])
    form = rng.choice(["lines", "histogram", "json-list", "json-dict"])
    if form == "lines":
        return "lengths.txt", "\n".join(str(c) for c in counts) + "\n"
    if form == "histogram":
        return "lengths.txt", "# length,count\n" + "\n".join(f"{c},{rng.randint(0, 9)}" for c in counts) + "\n"
    if form == "json-list":
        text = json.dumps({"lengths": counts} if rng.random() < 0.5 else counts)
    else:
        text = json.dumps({str(c): rng.randint(0, 9) for c in counts})
    if rng.junk(0.1):
        text = "[" * rng.choice([100, 10_000, 100_000]) + "]" * 100
    return "lengths.json", text


def _write(path: Path, data: Any) -> None:
    if isinstance(data, str):
        path.write_text(data)
    elif path.suffix == ".json":
        path.write_text(json.dumps(data))
    else:
        path.write_text(yaml.safe_dump(data))


def check(c: Case, workdir: Path) -> tuple[str, list[str]]:
    """``("planned" | "refused" | "crashed", problems)`` for one case."""
    from memfit.core.plan import make_plan
    from memfit.core.scenario.build import build_scenario, describe_scenario
    from memfit.core.scenario.inputs import ScenarioInputs
    from memfit.render.json_out import plan_to_dict

    folder = workdir / f"case-{c.seed}"
    folder.mkdir()
    (folder / "model.json").write_text(json.dumps(c.model_config))
    paths = {}
    for kind, (name, data) in c.files.items():
        _write(folder / name, data)
        paths[kind] = str(folder / name)
    inputs = ScenarioInputs(model=str(folder / "model.json"), **{k: v for k, v in c.inputs.items() if v is not None},
                            **paths)
    start = time.perf_counter()
    try:
        sc = build_scenario(inputs)
        plan = make_plan(sc)
        doc = plan_to_dict(plan, scenario=describe_scenario(sc))
        json.dumps(doc)
    except MemfitError as e:
        return "refused", ([] if "\n" not in str(e) else [f"a multi-line error: {str(e)[:200]!r}"]) + _slow(start)
    except Exception as e:  # noqa: BLE001 - the property under test
        return "crashed", [f"{type(e).__name__}: {str(e)[:300]}"]
    finally:
        for p in folder.iterdir():
            p.unlink()
        folder.rmdir()
    problems = _byte_problems(doc) + [f"silent key {k}" for k in _silent_keys(c.files, sc.input_warnings)]
    return "planned", problems + _slow(start)


def _silent_keys(files: dict, warnings: tuple[str, ...]) -> list[str]:
    """Keys of the files the plan neither knows (the library's own keys) nor warns about."""
    said = " ".join(warnings)
    out: list[str] = []
    ta = files.get("training_args", (None, {}))[1]
    if isinstance(ta, dict):
        known = TRAINING_ARGS_KEYS | SEQ2SEQ_TRAINING_ARGS_KEYS | LEGACY_TRAINING_ARGS_KEYS | SFT_CONFIG_KEYS | \
            LEGACY_SFT_KEYS
        out += [f"training_args.{k}" for k in ta if k not in known]  # transformers refuses them: so must memfit
        out += [f"training_args.{k} (not modelled, not warned)" for k, v in ta.items()
                if k in NOT_MODELLED and v not in (None, False, 0, "", [], {}) and k != "gradient_checkpointing_kwargs"
                and f"{k} =" not in said]
    acc = files.get("accelerate_config", (None, {}))[1]
    if isinstance(acc, dict):
        out += [f"accelerate.{k}" for k in acc if k not in ACCELERATE_KEYS]
        for section, table in (("fsdp_config", ACCELERATE_FSDP_KEYS), ("deepspeed_config", ACCELERATE_DEEPSPEED_KEYS)):
            sub = acc.get(section)
            used = {"fsdp_config": "FSDP", "deepspeed_config": "DEEPSPEED"}[section]
            if isinstance(sub, dict) and sub and acc.get("distributed_type") != used:
                out += [f"accelerate.{section} (not used, not warned)"] if f"{section} is not used" not in said else []
            elif isinstance(sub, dict):
                norm = (lambda k: k if k.startswith("fsdp") else f"fsdp_{k}") if section == "fsdp_config" else str
                out += [f"accelerate.{section}.{k}" for k in sub if norm(k) not in table and repr(norm(k)) not in said]
    bnb = files.get("bnb_config", (None, {}))[1]
    if isinstance(bnb, dict):
        bnb = bnb.get("quantization_config", bnb) if isinstance(bnb.get("quantization_config"), dict) else bnb
        out += [f"bnb.{k}" for k in bnb if k not in BNB_CONFIG_KEYS and k != "quantization_config"
                and repr(k) not in said]
    return out


def _slow(start: float) -> list[str]:
    took = time.perf_counter() - start
    return [f"took {took:.1f} s"] if took > SLOW_S else []
