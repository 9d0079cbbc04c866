"""Seeded generator of DeepSpeed configs and scenarios, and the properties every one must keep.

``case(seed)`` builds one scenario (a tiny model config, PEFT options, hardware, load and train
settings) with one DeepSpeed config. Half the seeds are "clean" (plausible values, most of which
plan), half "dirty": wrong types, "auto", huge, negative and non-finite numbers, misspelled and
unknown keys and contradicting inputs mixed in (most of which must be refused). ``check(case)`` plans it
and returns what went wrong, if anything:

- anything raised other than ``MemfitError`` (a crash, whatever the input);
- a byte figure in the plan's JSON that is negative, NaN or not an integer;
- a key of the DeepSpeed config that the plan neither reads, nor warns about (a refused config
  raises, so it cannot be silent);
- a plan that takes over ``SLOW_S`` (an input that exhausts time instead of being refused).

tests/robustness/test_fuzz.py runs 2,000 seeds in every test run; benchmarks/fuzz_inputs.py runs
10,000 or more.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memfit.core.dsconfig import (BF16_FIELDS, DEEPSPEED_OPTIMIZERS, FP16_FIELDS, KNOWN_TOP_LEVEL, LOOSE_SECTIONS,
                                  OFFLOAD_OPTIMIZER_FIELDS, OFFLOAD_PARAM_FIELDS, STRICT_SECTIONS, TORCH_OPTIMIZERS,
                                  ZERO_FIELDS)
from memfit.errors import MemfitError

SLOW_S = 2.0
"""A plan of a tiny model takes ~10 ms of CPU; one over 2 s means an input that should have been capped
(CPU time, which a loaded machine does not stretch as it does wall time)."""

JUNK: tuple[Any, ...] = ("auto", "", "yes", "3", None, True, False, -1, 0, 1.5, 10**30, -(10**30), float("nan"),
                         float("inf"), [], {}, [1, 2], {"a": 1}, "x" * 300)


class _Rng(random.Random):
    """A seeded generator that knows whether this case is dirty (junk allowed)."""

    dirty = False

    def junk(self, p: float) -> bool:
        return self.dirty and self.random() < p


def _typo(rng: random.Random, key: str) -> str:
    i = rng.randrange(len(key))
    return rng.choice([key[:i] + key[i + 1:], key[:i] + key[i] + key[i:], key.replace("_", "-"), key + "s",
                       key.upper(), key.replace("iz", "is")]) or key + "x"


def _value(rng: random.Random, kind: str) -> Any:
    """A plausible value of a DeepSpeed field kind, or (in a dirty case, one time in ten) junk."""
    if rng.junk(0.1):
        return rng.choice(JUNK)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "int":
        return rng.choice([0, 1, 2, 100, 10**6, 5 * 10**8, 10**9, 2**31, 1e9])
    if kind == "float":
        return rng.choice([0.0, 0.5, 1.0, 1e-3])
    if kind == "stage":
        return rng.choice([0, 1, 2, 3, 3, 3])
    if kind == "device":
        return rng.choice(["none", "cpu", "cpu", "nvme"])
    if kind == "path":
        return rng.choice(["/local_nvme", "nvme0"])  # only ever a string in the config, never opened
    return {}


def _section(rng: random.Random, table, *, p: float = 0.3) -> dict:
    out = {}
    for f in table:
        if rng.random() < p:
            key = f.alias if f.alias and rng.random() < 0.5 else f.name
            out[_typo(rng, key) if rng.junk(0.05) else key] = _value(rng, f.kind)
    return out


def ds_config(rng: random.Random) -> dict:
    cfg: dict[str, Any] = {}
    for key in ("train_micro_batch_size_per_gpu", "train_batch_size", "gradient_accumulation_steps"):
        if rng.random() < 0.6:
            cfg[key] = rng.choice([1, 2, 4, "auto"]) if not rng.junk(0.1) else rng.choice(JUNK + (3, 16))
    if not rng.dirty:  # a consistent batch triple: the micro batch, and accumulation or nothing
        cfg = {"train_micro_batch_size_per_gpu": rng.choice([1, 2, 4, "auto"])}
        if rng.random() < 0.4:
            cfg["gradient_accumulation_steps"] = rng.choice([1, 2, "auto"])
    zero = _section(rng, [f for f in ZERO_FIELDS if f.kind != "section"], p=0.06)
    zero["stage"] = _value(rng, "stage") if not rng.junk(0.1) else rng.choice(JUNK)
    for name, table in (("offload_param", OFFLOAD_PARAM_FIELDS), ("offload_optimizer", OFFLOAD_OPTIMIZER_FIELDS)):
        if rng.random() < 0.4:
            off = _section(rng, table, p=0.3)
            off["device"] = _value(rng, "device")
            if off["device"] == "nvme" and not rng.junk(0.3):
                off["nvme_path"] = "/local_nvme"
            zero[name] = off
    if not rng.dirty:
        zero = {k: v for k, v in zero.items() if k not in ("cpu_offload", "cpu_offload_param")}
        for name in ("offload_param", "offload_optimizer"):
            if isinstance(zero.get(name), dict):
                zero[name].pop("ratio", None)
    if rng.random() < 0.95:
        cfg[_typo(rng, "zero_optimization") if rng.junk(0.1) else "zero_optimization"] = zero
    for name, table in (("fp16", FP16_FIELDS), ("bf16", BF16_FIELDS)):
        if rng.random() < 0.4:
            sec = _section(rng, table, p=0.2)
            sec["enabled"] = rng.choice([True, False, "auto"])
            if not rng.dirty:
                sec = {"enabled": sec["enabled"]}
            cfg[_typo(rng, name) if rng.junk(0.1) else name] = sec
    if rng.random() < 0.6:
        name = rng.choice([*DEEPSPEED_OPTIMIZERS, *TORCH_OPTIMIZERS, "AdamW", "adam", "Foo", "sgd"]) if rng.dirty \
            else rng.choice(["AdamW", "Adam", "adam", "Lion", "Adagrad", "SGD"])
        params = {k: v for k, v in (("lr", rng.choice([1e-4, "auto"])), ("betas", rng.choice([[0.9, 0.99], "auto"])),
                                    ("momentum", rng.choice([0, 0.9])), ("amsgrad", rng.random() < 0.1),
                                    ("torch_adam", rng.random() < 0.2)) if rng.random() < 0.4}
        cfg["optimizer"] = {"type": name, "params": params}
        if rng.random() < 0.5:
            cfg["zero_allow_untested_optimizer"] = rng.random() < 0.7
    if rng.random() < 0.2:
        cfg["scheduler"] = {"type": "WarmupLR", "params": {"warmup_num_steps": rng.choice([10, "auto"])}}
    if rng.random() < 0.2:
        cfg["gradient_clipping"] = rng.choice([1.0, 0, "auto", 0.5, 1.0, -1, float("nan")])
    if rng.random() < 0.2:
        cfg["data_types"] = {rng.choice(["grad_accum_dtype", "param_dtype", "gradeint_accum_dtype"]):
                             rng.choice(["fp32", "bf16", "fp16", "int8", 5])}
    for _ in range(rng.choice([0, 0, 1, 2]) if rng.dirty else rng.choice([0, 0, 0, 1])):  # other keys
        key = rng.choice(sorted(KNOWN_TOP_LEVEL))
        roll = rng.random()
        if roll < 0.3:
            key = _typo(rng, key)
        elif roll < 0.4:
            key = rng.choice(["my_key", "zero_optimisation", "optimiser", "bf_16", "fp_16"])
        section = STRICT_SECTIONS.get(key) or LOOSE_SECTIONS.get(key)
        if section:
            sub = rng.choice(sorted(section))
            cfg[key] = {(_typo(rng, sub) if rng.random() < 0.3 else sub): rng.choice([True, 1, "x"])}
        else:
            cfg[key] = rng.choice([True, 1, "x", {"enabled": True}, [1]])
    return cfg


@dataclass(frozen=True)
class Case:
    seed: int
    model_config: dict
    inputs: dict
    deepspeed: dict


def case(seed: int) -> Case:
    rng = _Rng(seed)
    rng.dirty = seed % 2 == 1
    kind = rng.choice(["llama", "llama", "gpt2", "mixtral"])
    heads = rng.choice([2, 4])
    if kind == "gpt2":
        model = {"model_type": "gpt2", "n_layer": rng.choice([1, 2]), "n_embd": 16 * heads, "n_head": heads,
                 "vocab_size": 64, "n_positions": 64}
    else:
        model = {"model_type": kind, "vocab_size": 64, "hidden_size": 8 * heads, "intermediate_size": 24,
                 "num_hidden_layers": rng.choice([1, 2]), "num_attention_heads": heads,
                 "num_key_value_heads": rng.choice([1, heads])}
        if kind == "mixtral":
            model |= {"num_local_experts": 2, "num_experts_per_tok": rng.choice([1, 2])}
    peft = rng.choice([None, "full", "lora", "prefix", "prompt", "freeze"])
    options: dict[str, Any] = {}
    if peft == "lora":
        targets = ["c_attn"] if kind == "gpt2" else ["q_proj", "v_proj"]
        options = {k: v for k, v in (("lora_r", rng.choice([1, 8, 16] + ([0, "4", -1] if rng.dirty else []))),
                                     ("target_modules", rng.choice([None, "all-linear", targets] + (
                                         [["c_attn"], ["q_proj"], []] if rng.dirty else []))))
                   if v is not None and rng.random() < 0.7}
    elif peft in ("prefix", "prompt"):
        options = {"num_virtual_tokens": rng.choice([1, 4, 10] + ([0, -3, "x"] if rng.dirty else []))}
        if peft == "prefix" and rng.random() < 0.4:
            options |= {"prefix_projection": rng.choice([True, "yes", "no"]), "encoder_hidden_size": 16}
    elif peft == "freeze":
        embed = "*.wte.*" if kind == "gpt2" else "*.embed_tokens.*"
        options = {"freeze_patterns": rng.choice([[embed], ["*.0.*"]] + ([["nothing.matches"], ["*"]] if rng.dirty else []))}
    inputs = {
        "peft_method": peft, "peft_options": options,
        "gpus": rng.choice(["1xa100-80gb", "2xrtx3090", "8xh100", "4x24GiB", "t4", "3xv100"]),
        "nodes": rng.choice([None, 1, 2]), "cpu_ram": rng.choice([None, "64GiB", "1TB", "8GB"]),
        "nvme": rng.choice([None, None, "2TB"]), "load_dtype": rng.choice([None, "fp32", "bf16", "fp16"] if rng.dirty else [None, "fp32"]),
        "zero_init": rng.choice([None, True, False, "no"]),
        "seq_len": rng.choice([None, 16, 128, 2048] * 3 + ([10**5, 0, "x", 1.5] if rng.dirty else [])),
        "micro_batch": rng.choice([None] * 6 + [1, 2]) if rng.dirty else None, "gradient_checkpointing": rng.choice([None, True, False]),
        "model_parameters": rng.choice([None, "trainable", "all"]), "ds_version": rng.choice([None, "0.19", "0.6", "0.5"]),
        "precision": rng.choice([None] * 6 + ["bf16", "fp16", "fp32"]) if rng.dirty else None,
        "grad_accum": rng.choice([None] * 6 + [2]) if rng.dirty else None,
        "accelerator": rng.choice([None, None, "cpu"]), "attention": rng.choice([None, "eager", "sdpa"]),
    }
    return Case(seed=seed, model_config=model, inputs=inputs, deepspeed=ds_config(rng))


def _byte_problems(value: Any, where: str = "") -> list[str]:
    out = []
    if isinstance(value, dict):
        for k, v in value.items():
            path = f"{where}.{k}" if where else k
            if k.endswith("bytes") or k in ("bytes",):
                vals = v if isinstance(v, list) else [v]
                for x in vals:
                    if x is None:
                        continue
                    if isinstance(x, bool) or not isinstance(x, int) or (isinstance(x, float) and math.isnan(x)) or x < 0:
                        out.append(f"{path} = {x!r}")
            out += _byte_problems(v, path)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _byte_problems(v, f"{where}[{i}]")
    return out


def _silent_keys(raw: dict, warnings: tuple[str, ...]) -> list[str]:
    """Keys of the config the plan neither reads (a key DeepSpeed reads) nor warns about."""
    said = " ".join(warnings)
    out = [k for k in raw if k not in KNOWN_TOP_LEVEL and repr(k) not in said]
    for name, table in LOOSE_SECTIONS.items():
        sec = raw.get(name)
        if isinstance(sec, dict):
            out += [f"{name}.{k}" for k in sec if k not in table and f"{name}.{k}:" not in said]
    for name, table in STRICT_SECTIONS.items():  # an unknown key there must have been refused
        sec = raw.get(name)
        if isinstance(sec, dict):
            out += [f"{name}.{k}" for k in sec if k not in table]
    return out


def check(c: Case, workdir: Path) -> tuple[str, list[str]]:
    """``("planned" | "refused", problems)`` for one case."""
    from memfit.core.plan import make_plan
    from memfit.core.scenario.build import build_scenario, describe_scenario
    from memfit.core.scenario.inputs import ScenarioInputs
    from memfit.render.json_out import plan_to_dict

    model = workdir / f"model-{c.seed}.json"
    model.write_text(json.dumps(c.model_config))
    inputs = ScenarioInputs(model=str(model), deepspeed_inline=c.deepspeed,
                            **{k: v for k, v in c.inputs.items() if v is not None and k != "peft_options"},
                            peft_options=c.inputs["peft_options"] if c.inputs["peft_method"] else {})
    start = time.process_time()
    try:
        sc = build_scenario(inputs)
        plan = make_plan(sc)
        doc = plan_to_dict(plan, scenario=describe_scenario(sc))
        json.dumps(doc)
    except MemfitError as e:
        problems = [] if "\n" not in str(e) else [f"a multi-line error: {str(e)[:200]!r}"]
        return "refused", problems + _slow(start)
    except Exception as e:  # noqa: BLE001 - the property under test
        return "crashed", [f"{type(e).__name__}: {str(e)[:300]}"]
    finally:
        model.unlink()
    problems = _byte_problems(doc) + [f"silent key {k}" for k in _silent_keys(c.deepspeed, sc.deepspeed.warnings)]
    return "planned", problems + _slow(start)


def _slow(start: float) -> list[str]:
    took = time.process_time() - start
    return [f"took {took:.1f} s"] if took > SLOW_S else []
