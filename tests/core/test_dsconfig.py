"""Reading DeepSpeed JSON into ``DeepSpeedSettings``: the pure-Python side.

What DeepSpeed itself does with the same configs (defaults, rejections, derived batch sizes) is
checked in ``tests/exact/test_dsconfig_against_deepspeed.py``; here: the seed config, "auto"
resolution and its errors, refusals with one-line messages, file loading, and that parsing imports
no heavy library.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from memfit.core.dsconfig import (
    AUTO_FLAGS,
    AutoContext,
    load_deepspeed_config,
    parse_deepspeed_config,
    resolve_auto,
)
from memfit.core.frameworks.deepspeed import DeepSpeedSettings
from memfit.errors import MemfitError

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "deepspeed"
EXAMPLES = ROOT / "examples" / "deepspeed"
SEED_TEXT = ROOT / "tests" / "fixtures" / "seed" / "deepspeed-prefix-tuning-oom.txt"
"""The seed case as reported (DeepSpeed issue #1661), shipped so the check runs everywhere."""
SEED = FIXTURES / "seed_kogpt_zero3_offload.json"
HF_AUTO = FIXTURES / "zero3_hf_trainer_auto.json"

# What a Trainer run would pass (TrainingArguments + model + step count) for the "auto" fixture.
TRAINER = AutoContext(micro_batch_size=4, gradient_accumulation_steps=2, world_size=2, learning_rate=3e-5,
                      adam_betas=(0.9, 0.98), adam_epsilon=1e-6, weight_decay=0.01, warmup_steps=0.1,
                      total_steps=1000, precision="bf16", max_grad_norm=0.5, hidden_size=4096)


def _cases(name: str) -> dict:
    return {k: v for k, v in json.loads((FIXTURES / name).read_text()).items() if not k.startswith("_")}


def test_seed_fixture_is_the_seed_config_verbatim():
    assert SEED.read_text().strip() in SEED_TEXT.read_text()
    assert (EXAMPLES / SEED.name).read_text() == SEED.read_text()


def test_seed_config_reads_as_written():
    raw = json.loads(SEED.read_text())
    ds, resolved = load_deepspeed_config(SEED, context=AutoContext(world_size=2))
    assert resolved == raw  # nothing to resolve
    z = raw["zero_optimization"]
    assert ds.precision == "fp16"
    assert ds.zero.stage == z["stage"]
    assert (ds.zero.offload_param.device, ds.zero.offload_param.pin_memory) == ("cpu", True)
    assert (ds.zero.offload_optimizer.device, ds.zero.offload_optimizer.pin_memory) == ("cpu", True)
    assert ds.zero.overlap_comm is z["overlap_comm"]
    assert ds.zero.sub_group_size == int(z["sub_group_size"]) and isinstance(ds.zero.sub_group_size, int)
    assert ds.zero.reduce_bucket_size == int(z["reduce_bucket_size"])
    assert ds.zero.prefetch_bucket_size == int(z["stage3_prefetch_bucket_size"])
    assert ds.zero.param_persistence_threshold == int(z["stage3_param_persistence_threshold"])
    assert ds.zero.max_live_parameters == int(z["stage3_max_live_parameters"])
    assert ds.zero.max_reuse_distance == int(z["stage3_max_reuse_distance"])
    assert ds.zero.gather_16bit_weights_on_model_save is True  # from the deprecated fp16 name
    assert any("stage3_gather_fp16_weights_on_model_save is deprecated" in n for n in ds.notes)
    assert (ds.optimizer.type, ds.optimizer.in_config, ds.optimizer.states_per_param) == ("adam", True, 2)
    assert dict(ds.optimizer.params)["betas"] == tuple(raw["optimizer"]["params"]["betas"])
    assert ds.scheduler_type == "WarmupLR" and ds.has_scheduler
    assert (ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps, ds.train_batch_size) == (1, 1, 2)
    assert ds.world_size == 2 and ds.gradient_clipping == 1.0
    hash(ds)  # frozen and hashable, params included


def test_without_world_size_the_global_batch_stays_unknown():
    ds = parse_deepspeed_config(json.loads(SEED.read_text()))
    assert ds.train_batch_size is None and ds.world_size is None
    assert any("world size unknown" in n for n in ds.notes)
    with pytest.raises(MemfitError, match=r"--gpus"):
        parse_deepspeed_config({"train_batch_size": 32})


CONFIG_FILES = sorted(p for p in EXAMPLES.glob("*.json") if not p.name.startswith("trainer_args")) + sorted(
    p for p in FIXTURES.glob("*.json") if p.name not in ("variants.json", "rejected.json"))
"""DeepSpeed JSONs (examples/deepspeed/trainer_args_*.json are TrainingArguments files that name one)."""


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_example_and_fixture_config_reads(path):
    ds, resolved = load_deepspeed_config(path, context=TRAINER if "auto" in path.name else AutoContext(world_size=2))
    assert isinstance(ds, DeepSpeedSettings)
    assert '"auto"' not in json.dumps(resolved)


@pytest.mark.parametrize("name,case", _cases("variants.json").items(), ids=list(_cases("variants.json")))
def test_variants_read(name, case):
    ctx = AutoContext(world_size=case["world_size"], hidden_size=case.get("hidden_size"))
    ds = parse_deepspeed_config(case["config"], context=ctx)
    assert isinstance(ds.zero.overlap_comm, bool)


@pytest.mark.parametrize("name,case", _cases("rejected.json").items(), ids=list(_cases("rejected.json")))
def test_rejected_configs_raise_one_clear_line(name, case):
    with pytest.raises(MemfitError) as err:
        parse_deepspeed_config(case["config"], context=AutoContext(world_size=case.get("world_size", 1)))
    assert case["match"] in str(err.value)
    assert "\n" not in str(err.value)


def test_parse_does_not_modify_its_input():
    raw = json.loads(HF_AUTO.read_text())
    before = json.dumps(raw, sort_keys=True)
    resolve_auto(raw, TRAINER)
    parse_deepspeed_config(raw, context=TRAINER)
    assert json.dumps(raw, sort_keys=True) == before


# ---------------------------------------------------------------- "auto", as the Trainer fills it


def test_trainer_auto_values_are_filled_from_the_context():
    ds, resolved = load_deepspeed_config(HF_AUTO, context=TRAINER)
    h = TRAINER.hidden_size
    z = resolved["zero_optimization"]
    # transformers integrations/deepspeed.py trainer_config_finalize: h*h, int(0.9*h*h), 10*h
    assert z["reduce_bucket_size"] == h * h == ds.zero.reduce_bucket_size
    assert z["stage3_prefetch_bucket_size"] == int(0.9 * h * h) == ds.zero.prefetch_bucket_size
    assert z["stage3_param_persistence_threshold"] == 10 * h == ds.zero.param_persistence_threshold
    assert "stage3_gather_16bit_weights_on_model_save" not in z  # "auto" left: DeepSpeed's default
    assert resolved["train_micro_batch_size_per_gpu"] == TRAINER.micro_batch_size
    assert resolved["gradient_accumulation_steps"] == TRAINER.gradient_accumulation_steps
    t = TRAINER
    assert resolved["train_batch_size"] == t.world_size * t.micro_batch_size * t.gradient_accumulation_steps
    assert resolved["gradient_clipping"] == TRAINER.max_grad_norm == ds.gradient_clipping
    assert resolved["optimizer"]["params"] == {"lr": TRAINER.learning_rate, "betas": list(TRAINER.adam_betas),
                                               "eps": TRAINER.adam_epsilon, "weight_decay": TRAINER.weight_decay}
    sched = resolved["scheduler"]["params"]
    assert sched["warmup_min_lr"] == 0 and sched["warmup_max_lr"] == TRAINER.learning_rate
    assert sched["total_num_steps"] == TRAINER.total_steps
    assert sched["warmup_num_steps"] == 100  # ceil(1000 * 0.1)
    assert (resolved["fp16"]["enabled"], resolved["bf16"]["enabled"]) == (False, True)
    assert ds.precision == "bf16"


NEEDED_BY_HF_AUTO = ["micro_batch_size", "gradient_accumulation_steps", "world_size", "learning_rate",
                     "adam_betas", "adam_epsilon", "weight_decay", "warmup_steps", "total_steps",
                     "precision", "max_grad_norm", "hidden_size"]


@pytest.mark.parametrize("field", NEEDED_BY_HF_AUTO)
def test_an_auto_the_context_cannot_fill_names_the_flag(field):
    ctx = dataclasses.replace(TRAINER, **{field: None})
    with pytest.raises(MemfitError, match=AUTO_FLAGS[field]) as err:
        parse_deepspeed_config(json.loads(HF_AUTO.read_text()), context=ctx)
    assert '"auto"' in str(err.value) and "\n" not in str(err.value)


def test_a_written_value_that_disagrees_with_the_trainer_is_refused():
    raw = json.loads(HF_AUTO.read_text())
    raw["train_micro_batch_size_per_gpu"] = 8
    raw["optimizer"]["params"]["lr"] = 1e-3
    with pytest.raises(MemfitError, match=r"train_micro_batch_size_per_gpu=8 vs --micro-batch 4; "
                                          r"optimizer.params.lr=0.001 vs TrainingArguments.learning_rate 3e-05"):
        parse_deepspeed_config(raw, context=TRAINER)
    # a written value is only checked against a context value that is given
    raw["optimizer"]["params"]["lr"] = "auto"
    ds = parse_deepspeed_config(raw, context=dataclasses.replace(TRAINER, micro_batch_size=None))
    assert ds.train_micro_batch_size_per_gpu == 8
    assert ds.train_batch_size == 8 * TRAINER.gradient_accumulation_steps * TRAINER.world_size


def test_hidden_size_keys_below_stage3_fill_only_the_reduce_bucket():
    raw = {"train_micro_batch_size_per_gpu": 1,
           "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto"}}
    resolved = resolve_auto(raw, AutoContext(hidden_size=10))
    assert resolved["zero_optimization"] == {"stage": 2, "reduce_bucket_size": 100}


def test_unprefixed_alias_auto_is_not_filled_by_the_trainer():
    raw = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "prefetch_bucket_size": "auto"}}
    resolved = resolve_auto(raw, AutoContext(hidden_size=10))
    assert resolved["zero_optimization"] == {"stage": 3}


def test_trainer_fill_plus_written_alias_is_refused_like_deepspeed():
    raw = {"train_micro_batch_size_per_gpu": 1,
           "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": "auto", "prefetch_bucket_size": 7}}
    with pytest.raises(MemfitError, match="not both"):
        parse_deepspeed_config(raw, context=AutoContext(hidden_size=10))


def test_auto_the_trainer_never_fills_is_refused_where_deepspeed_would_read_it():
    raw = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "SGD", "params": {"momentum": "auto"}}}
    with pytest.raises(MemfitError, match=r"optimizer.params.momentum is \"auto\""):
        parse_deepspeed_config(raw)


@pytest.mark.parametrize("kwargs,flag", [({"world_size": 0}, "--gpus"), ({"precision": "fp8"}, "--precision"),
                                         ({"micro_batch_size": True}, "--micro-batch"),
                                         ({"adam_betas": (0.9,)}, "adam_beta1"),
                                         ({"learning_rate": float("nan")}, "learning_rate"),
                                         ({"max_grad_norm": float("inf")}, "max_grad_norm")])
def test_context_values_are_checked(kwargs, flag):
    with pytest.raises(MemfitError, match=flag):
        AutoContext(**kwargs)


# ---------------------------------------------------------------- files, notes, speed


def test_load_refuses_duplicates_bad_json_and_non_objects(tmp_path):
    cases = {"dup.json": ('{"fp16": {}, "fp16": {}}', "duplicate keys"),
             "bad.json": ('{"fp16": {,}', "not valid JSON"),
             "list.json": ("[1, 2]", "must be a JSON object")}
    for name, (text, match) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(MemfitError, match=match):
            load_deepspeed_config(tmp_path / name)
    with pytest.raises(MemfitError, match="not found"):
        load_deepspeed_config(tmp_path / "missing.json")


def test_typo_at_top_level_is_a_warning_not_refused():
    """DeepSpeed ignores unknown top-level keys (runtime/config.py reads the ones it knows), so memfit
    does not refuse them; it warns, naming the key it most likely meant."""
    ds = parse_deepspeed_config({"train_micro_batch_size_per_gpu": 2, "gradient_acumulation_steps": 4})
    assert ds.gradient_accumulation_steps == 1
    assert any("gradient_acumulation_steps" in n and "did you mean 'gradient_accumulation_steps'" in n
               for n in ds.warnings)


def test_every_auto_resolved_is_recorded_with_its_value_and_reason():
    ds = parse_deepspeed_config(json.loads(HF_AUTO.read_text()), context=TRAINER)
    said = "\n".join(ds.auto_resolved)
    raw = json.loads(HF_AUTO.read_text())
    autos = [k for k, v in raw.items() if v == "auto"] + [f"{s}.{k}" for s, sec in raw.items() if isinstance(sec, dict)
                                                          for k, v in sec.items() if v == "auto"]
    autos += [f"{s}.params.{k}" for s in ("optimizer", "scheduler") for k, v in raw.get(s, {}).get("params", {}).items()
              if v == "auto"]
    assert autos and all(k in said for k in autos), (autos, said)
    assert f"train_micro_batch_size_per_gpu = {TRAINER.micro_batch_size} (--micro-batch)" in said


def test_optimizer_states_follow_the_optimizer_actually_built():
    base = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}
    lion = {**base, "optimizer": {"type": "Lion", "params": {}}}
    lion_cpu = {**lion, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    sgd = {**base, "zero_allow_untested_optimizer": True, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
    sgd_m = {**sgd, "optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}}
    got = [parse_deepspeed_config(c).optimizer.states_per_param for c in (lion, lion_cpu, sgd, sgd_m)]
    assert got == [1, 2, 0, 1]  # FusedLion; DeepSpeedCPULion keeps exp_avg_sq too; SGD momentum buffer
    assert parse_deepspeed_config(base).optimizer.in_config is False


def test_parsing_imports_no_heavy_library():
    code = ("import sys, time; t = time.perf_counter();"
            "from memfit.core.dsconfig import load_deepspeed_config, AutoContext;"
            f"load_deepspeed_config({str(SEED)!r}, context=AutoContext(world_size=2));"
            "print(time.perf_counter() - t);"
            "heavy = [m for m in ('torch', 'deepspeed', 'pydantic', 'transformers', 'peft') if m in sys.modules];"
            "assert not heavy, heavy")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # measured 0.09 s; printed, not asserted (a loaded machine stretches wall time, issue 24): the speed  # time-ok: a comment, it times nothing
    # target, memfit plan under 0.5 s in all, is benchmarks/bench_plan.py's
    print(f"parse: {float(out.stdout):.3f} s")
