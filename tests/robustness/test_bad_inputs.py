"""Bad input, family by family (issue 11): one line on stderr, exit status 2, never a traceback,
never a silent guess. Every input is generated here, in tmp_path."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from clirun import assert_one_line_error, cli
from conftest import EXAMPLES, FIXTURES, SEED
from memfit.core.dsconfig import AutoContext, parse_deepspeed_config
from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.inputs import ScenarioInputs
from memfit.core.scenario.read import read_scenario_file
from memfit.core.scenario.validate import check_inputs
from memfit.errors import MemfitError

TINY = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2}
DS = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}


@pytest.fixture(autouse=True)
def _no_hub(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def tiny(tmp_path) -> Path:
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(TINY))
    return tmp_path / "tiny"


def scenario(tmp_path: Path, doc: dict | str, name: str = "s.yaml") -> Path:
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return p


def base_doc(tiny: Path, **extra) -> dict:
    return {"model": str(tiny), "deepspeed": DS, "hardware": {"gpus": "1xa100-80gb"}, **extra}


# ------------------------------------------------------------------------ silent wrong answers

@pytest.mark.parametrize("section,key,field", [("train", "gradient_checkpointing", "gradient_checkpointing"),
                                               ("load", "zero_init", "zero_init"),
                                               ("load", "low_cpu_mem_usage", "low_cpu_mem_usage"),
                                               (None, "trust_remote_code", "trust_remote_code")])
@pytest.mark.parametrize("word,value", [("no", False), ("false", False), ("off", False), ("No", False),
                                        ("yes", True), ("true", True), ("TRUE", True)])
def test_quoted_yaml_booleans_mean_what_they_say(tmp_path, tiny, section, key, field, word, value):
    doc = base_doc(tiny)
    if section:
        doc[section] = {key: word}
    else:
        doc[key] = word
    inputs = check_inputs(read_scenario_file(scenario(tmp_path, doc)))
    assert getattr(inputs, field) is value


@pytest.mark.parametrize("word", ["maybe", "0", "1", "", "flase", 5, [True]])
def test_anything_else_is_not_a_boolean(tmp_path, tiny, word):
    doc = base_doc(tiny, train={"gradient_checkpointing": word})
    assert_one_line_error(cli("plan", str(scenario(tmp_path, doc))), "gradient_checkpointing")


def test_a_misspelled_deepspeed_section_is_said_out_loud(tmp_path, tiny):
    doc = base_doc(tiny, deepspeed={"train_micro_batch_size_per_gpu": 1, "zero_optimisation": {"stage": 3},
                                    "optimiser": {"type": "AdamW"}, "bf_16": {"enabled": True},
                                    "gradient_accumulation_step": 4})
    r = cli("plan", str(scenario(tmp_path, doc)), "--json")
    assert r.rc == 0, r.err
    plan = json.loads(r.out)
    said = [f["message"] for f in plan["findings"] if f["id"] == "deepspeed-config-ignored"]
    for typo, meant in (("zero_optimisation", "zero_optimization"), ("optimiser", "optimizer"), ("bf_16", "bf16"),
                        ("gradient_accumulation_step", "gradient_accumulation_steps")):
        assert any(typo in m and f"did you mean '{meant}'" in m for m in said), typo
        assert any(typo in ln and "memfit: warning:" in ln for ln in r.err.splitlines()), typo
    assert plan["scenario"]["zero_stage"] == 0  # what DeepSpeed itself does (tests/exact checks it)


def test_an_unknown_key_in_a_section_deepspeed_forbids_is_an_error(tmp_path, tiny):
    doc = base_doc(tiny, deepspeed={**DS, "tensorboard": {"enabeld": True}})
    assert_one_line_error(cli("plan", str(scenario(tmp_path, doc))), "tensorboard.enabeld", "did you mean 'enabled'")


def test_offload_param_below_stage_3_is_a_printed_warning(tmp_path, tiny):
    doc = base_doc(tiny, deepspeed={"train_micro_batch_size_per_gpu": 1,
                                    "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})
    r = cli("plan", str(scenario(tmp_path, doc)))
    assert r.rc == 0 and "offload_param is used by ZeRO stage 3 only" in r.err


def test_every_auto_resolved_is_listed_with_value_and_reason(tmp_path, tiny):
    hf = json.loads((FIXTURES / "deepspeed" / "zero3_hf_trainer_auto.json").read_text())
    doc = base_doc(tiny, deepspeed=hf)
    plan = json.loads(cli("plan", str(scenario(tmp_path, doc)), "--json").out)
    [auto] = [f["message"] for f in plan["findings"] if f["id"] == "deepspeed-auto-resolved"]
    autos = [k for k, v in hf.items() if v == "auto"]
    autos += [f"{s}.{k}" for s, sec in hf.items() if isinstance(sec, dict) for k, v in sec.items() if v == "auto"]
    autos += [f"{s}.params.{k}" for s in ("optimizer", "scheduler") for k, v in hf.get(s, {}).get("params", {}).items()
              if v == "auto"]
    assert len(autos) > 8
    for key in autos:
        assert key in auto, key
    assert "TrainingArguments default" in auto and "as the Trainer sizes it" in auto


def test_precision_resolved_from_the_gpu_says_so_and_the_flag_chooses(tmp_path, tiny):
    doc = base_doc(tiny, deepspeed={**DS, "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}})
    path = str(scenario(tmp_path, doc))
    plan = json.loads(cli("plan", path, "--json", "--gpus", "t4").out)
    assert plan["scenario"]["precision"] == "fp16"
    assert any("the GPU (t4" in f["message"] for f in plan["findings"])
    assert json.loads(cli("plan", path, "--json", "--precision", "bf16").out)["scenario"]["precision"] == "bf16"
    assert_one_line_error(cli("plan", path, "--precision", "fp8"), "--precision", "fp8")


def test_grad_accum_flag_fills_auto_and_contradicts_a_written_value(tmp_path, tiny):
    doc = base_doc(tiny, deepspeed={**DS, "gradient_accumulation_steps": "auto"})
    r = cli("plan", str(scenario(tmp_path, doc)), "--json", "--grad-accum", "4")
    assert r.rc == 0, r.err
    doc = base_doc(tiny, deepspeed={**DS, "gradient_accumulation_steps": 2})
    assert_one_line_error(cli("plan", str(scenario(tmp_path, doc)), "--grad-accum", "4"), "gradient_accumulation_steps")


def _value_options():
    import typer.main

    from memfit.cli import app

    command = typer.main.get_command(app)
    for name, cmd in command.commands.items():
        for p in cmd.params:
            if not getattr(p, "is_flag", False) and p.param_type_name in ("option", "argument"):
                yield name, p


def _args_for(command: str, param, value: str) -> list[str]:
    """``memfit COMMAND`` with ``param`` set to ``value`` and every other required input present
    (arguments in order, each a real file, so only the one under test is wrong)."""
    import typer.main

    from memfit.cli import app

    cmd = typer.main.get_command(app).commands[command]
    args = [command]
    for p in cmd.params:
        if p.param_type_name != "argument":
            continue
        if p.name == param.name:
            args.append(value)
        elif p.required or any(q.name == param.name for q in cmd.params[cmd.params.index(p):]
                               if q.param_type_name == "argument"):
            args.append(str(SEED))
    for p in cmd.params:
        if p.param_type_name == "option" and p.required and p.name != param.name:
            args += [p.opts[0], str(FIXTURES / "logs" / "seed-move-oom-ds0510.txt")]
    if param.param_type_name == "option":
        args += [param.opts[0], value]
    return args


@pytest.mark.parametrize("value", ["", "   "])
def test_an_empty_value_is_an_error_for_every_option_of_every_command(value):
    seen = 0
    for command, param in _value_options():
        r = cli(*_args_for(command, param, value))
        name = param.opts[0] if param.param_type_name == "option" else param.name.upper()
        assert_one_line_error(r, "is empty")
        assert name in r.err or param.human_readable_name in r.err, (command, name, r.err)
        seen += 1
    assert seen >= 45  # every value-taking option and argument of plan, trace, replay, recommend, diagnose


@pytest.mark.parametrize("key,value", [("model", ""), ("name", ""), ("peft", ""), ("deepspeed", ""),
                                       ("deepspeed_version", " ")])
def test_an_empty_value_in_the_scenario_file_is_an_error(tmp_path, tiny, key, value):
    doc = base_doc(tiny)
    doc[key] = value
    assert_one_line_error(cli("plan", str(scenario(tmp_path, doc))))


@pytest.mark.parametrize("section,key", [("hardware", "gpus"), ("hardware", "cpu_ram"), ("load", "dtype"),
                                         ("train", "model_parameters"), ("train", "attention")])
def test_an_empty_section_value_is_an_error(tmp_path, tiny, section, key):
    doc = base_doc(tiny)
    doc.setdefault(section, {})[key] = ""
    assert_one_line_error(cli("plan", str(scenario(tmp_path, doc))), "is empty")


@pytest.mark.parametrize("change,message", [({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads"),
                                            ({"num_key_value_heads": 8}, "more than num_attention_heads"),
                                            ({"num_hidden_layers": 1_000_000}, "at most 1,024"),
                                            ({"num_hidden_layers": 10**9}, "at most 1,024"),
                                            ({"hidden_size": 10**400}, "huge number"),
                                            ({"partial_rotary_factor": 0}, "partial_rotary_factor")])
def test_impossible_or_absurd_model_configs(tmp_path, change, message):
    (tmp_path / "config.json").write_text(json.dumps({**TINY, **change}))
    assert_one_line_error(cli("plan", "--model", str(tmp_path / "config.json")), message)


def test_moe_top_k_above_the_experts(tmp_path):
    moe = {**TINY, "model_type": "mixtral", "num_local_experts": 2, "num_experts_per_tok": 3}
    (tmp_path / "config.json").write_text(json.dumps(moe))
    assert_one_line_error(cli("plan", "--model", str(tmp_path / "config.json")), "num_experts_per_tok 3 is more than")


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_numbers_in_a_model_config(tmp_path, number):
    (tmp_path / "config.json").write_text(json.dumps(TINY)[:-1] + f', "rope_theta": {number}}}')
    assert_one_line_error(cli("plan", "--model", str(tmp_path / "config.json")))


def _walk_numbers(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _walk_numbers(v)
    elif isinstance(value, list):
        for v in value:
            yield from _walk_numbers(v)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield value


def test_diagnose_never_reports_a_negative_byte_figure(tmp_path):
    """A torch 1.x message whose figures contradict each other (reserved below allocated, free above
    the total): no figure rather than a negative one."""
    log = ("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 23.69 GiB total capacity; "
           "20.00 GiB already allocated; 30.00 GiB free; 1.00 GiB reserved in total by PyTorch)\n")
    (tmp_path / "log.txt").write_text(log)
    r = cli("diagnose", str(SEED), "--log", str(tmp_path / "log.txt"), "--json")
    assert r.rc == 0, r.err
    numbers = list(_walk_numbers(json.loads(r.out)))
    assert numbers and min(numbers) >= 0


# --------------------------------------------------------------------------------- tracebacks

def _nested(depth: int, leaf=1):
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize("depth", [100, 900, 5000])
def test_deep_nesting_everywhere(tmp_path, tiny, depth):
    deep_json = "{" + '"a": {' * depth + "}" * depth + "}"
    ds = tmp_path / "ds.json"
    ds.write_text('{"train_micro_batch_size_per_gpu": 1, "wandb": ' + deep_json + "}")
    assert_one_line_error(cli("plan", "--model", str(tiny), "--deepspeed", str(ds)), "nested")
    sc = scenario(tmp_path, f"model: {tiny}\ndeepspeed: " + "[" * depth + "]" * depth + "\n")
    assert_one_line_error(cli("plan", str(sc)))
    (tmp_path / "config.json").write_text(json.dumps(TINY)[:-1] + ', "x": ' + deep_json + "}")
    assert_one_line_error(cli("plan", "--model", str(tmp_path / "config.json")), "nested")
    adapter = tmp_path / "adapter_config.json"
    adapter.write_text('{"peft_type": "LORA", "x": ' + deep_json + "}")
    assert_one_line_error(cli("plan", "--model", str(tiny), "--peft", str(adapter)), "nested")
    with pytest.raises(MemfitError, match="nested"):
        parse_deepspeed_config({"train_micro_batch_size_per_gpu": 1, "wandb": _nested(depth)})


@pytest.mark.parametrize("flag,value", [("--gpus", "9" * 400 + "xa100"), ("--gpus", "2x" + "9" * 400 + "GiB"),
                                        ("--cpu-ram", "9" * 400 + "GB"), ("--nvme", "9" * 400 + "TB"),
                                        ("--cpu-ram", "1" + "0" * 19 + "GiB"), ("--gpus", "2000xa100"),
                                        ("--seq-len", "9" * 400), ("--micro-batch", "9" * 30),
                                        ("--nodes", "9" * 400), ("--gpus", "x" * 100_000)])
def test_huge_numbers_in_flags(tiny, flag, value):
    assert_one_line_error(cli("plan", "--model", str(tiny), flag, value))


@pytest.mark.parametrize("doc", [{"hardware": {"nodes": 10**400}}, {"train": {"seq_len": 10**400}},
                                 {"train": {"micro_batch": float("inf")}},
                                 {"deepspeed": {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": float("nan")}},
                                 {"deepspeed": {"train_batch_size": "auto", "gradient_accumulation_steps": float("inf"),
                                                "train_micro_batch_size_per_gpu": 1}},
                                 {"deepspeed": {"train_micro_batch_size_per_gpu": 10**400}}])
def test_huge_and_non_finite_numbers_in_the_scenario(tmp_path, tiny, doc):
    assert_one_line_error(cli("plan", str(scenario(tmp_path, base_doc(tiny, **doc)))))


@pytest.mark.parametrize("text", ["1: 2\n", "model: m\ndeepspeed: {1: 2}\n", "model: m\npeft: {1: lora}\n",
                                  "model: m\nhardware: {2: x}\n", "? [a, b]\n: 1\n"])
def test_non_string_keys(tmp_path, text):
    assert_one_line_error(cli("plan", str(scenario(tmp_path, text))))


def test_non_string_keys_through_the_api():
    with pytest.raises(MemfitError, match="must be a string"):
        parse_deepspeed_config({"train_micro_batch_size_per_gpu": 1, 1: 2})
    with pytest.raises(MemfitError, match="must be a string"):
        parse_deepspeed_config({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {(1, 2): 3}})


@pytest.mark.parametrize("peft", [{"method": 5}, ["lora"], {"method": "lora", "target_modules": 5},
                                  {"adapter_config": 5}, {"method": ["lora"]}, {"method": "lora", "r": "x"},
                                  {"method": "lora", "lora_r": [8]}, {"adapter_config": ""}, 5.5])
def test_wrong_types_in_the_peft_section(tmp_path, tiny, peft):
    assert_one_line_error(cli("plan", str(scenario(tmp_path, base_doc(tiny, peft=peft)))))


@pytest.mark.parametrize("doc", [{"train": {"seq_len": "abc"}}, {"hardware": {"gpus": [1]}}, {"name": {"a": 1}},
                                 {"load": {"dtype": 16}}, {"train": [1]}, {"accelerator": True},
                                 {"train": {"seq_lenght": 512}}])
def test_wrong_types_and_keys_elsewhere(tmp_path, tiny, doc):
    assert_one_line_error(cli("plan", str(scenario(tmp_path, base_doc(tiny, **doc)))))


def test_bad_files(tmp_path, tiny):
    bad = tmp_path / "adapter_config.json"
    bad.write_bytes(b'{"peft_type": "LORA", "r": 8, "x": "\xff\xfe"}')
    assert_one_line_error(cli("plan", "--model", str(tiny), "--peft", str(bad)), "UTF-8")
    for ref in ("a" * 300, "b/" * 200 + "config.json", str(tmp_path / ("c" * 300) / "config.json"), "x\x00y"):
        assert_one_line_error(cli("plan", "--model", ref))
    assert_one_line_error(cli("plan", str(tmp_path)), "directory")
    assert_one_line_error(cli("plan", "--model", str(tiny), "--deepspeed", str(tmp_path)), "directory")


def test_report_never_writes_through_a_link_or_under_a_file(tmp_path, tiny):
    target = tmp_path / "target.html"
    dangling = tmp_path / "dangling.html"
    dangling.symlink_to(target)
    assert_one_line_error(cli("plan", "--model", str(tiny), "--report", str(dangling)), "exists")
    assert not target.exists()
    (tmp_path / "file.txt").write_text("x")
    assert_one_line_error(cli("plan", "--model", str(tiny), "--report", str(tmp_path / "file.txt" / "r.html")),
                          "not a directory")
    unwritable = "/proc/memfit-report.html"  # guard: allowed (a real directory no file can be created in)
    assert_one_line_error(cli("plan", "--model", str(tiny), "--report", unwritable))
    assert_one_line_error(cli("plan", "--model", str(tiny), "--report", str(tmp_path / "r.txt")), ".html or .md")
    ok = tmp_path / "r.md"
    assert cli("plan", "--model", str(tiny), "--report", str(ok)).rc == 0 and ok.read_text()


def test_recommend_out_under_a_file(tmp_path):
    (tmp_path / "file.txt").write_text("x")
    assert_one_line_error(cli("recommend", str(SEED), "--out", str(tmp_path / "file.txt" / "out")))


@pytest.mark.parametrize("name", ["[/bold]", "[red]x[/red]", "[link=http://x]y", "[bold", "\\[x]"])
def test_rich_markup_in_user_text_is_printed_as_written(tmp_path, tiny, name, monkeypatch):
    r = cli("plan", str(scenario(tmp_path, base_doc(tiny, name=name))))
    assert r.rc == 0, r.err
    assert name in r.out
    marked = tmp_path / name.replace("/", "_")
    marked.mkdir()
    (marked / "config.json").write_text(json.dumps(TINY))
    monkeypatch.chdir(tmp_path)  # a short relative path, so the panel title shows it whole
    r = cli("plan", "--model", marked.name)
    assert r.rc == 0 and marked.name in r.out


# ---------------------------------------------------------------------- messages that lead on

def test_memfit_alone_shows_the_help():
    r = cli()
    assert r.rc == 0 and "Usage" in r.out and "plan" in r.out and "error" not in r.err


def test_flags_named_in_messages_exist():
    import typer.main

    from memfit.cli import app
    from memfit.core.dsconfig import AUTO_FLAGS

    plan = typer.main.get_command(app).commands["plan"]
    options = {o for p in plan.params for o in p.opts}
    flags = {f for f in AUTO_FLAGS.values() if f.startswith("--")}
    assert flags and flags <= options, flags - options


@pytest.mark.parametrize("args,fragment", [(["--emulate", "foo"], "--emulate: unknown GPU 'foo'"),
                                           (["--timeout", "nan"], "--timeout"), (["--timeout", "0"], "--timeout"),
                                           (["--timeout", "-1"], "--timeout"), (["--timeout", "inf"], "--timeout"),
                                           (["--layers", "0"], "--layers"), (["--steps", "0"], "--steps")])
def test_replay_arguments(args, fragment):
    assert_one_line_error(cli("replay", str(SEED), *args), fragment)


def test_trace_top_and_recommend_numbers():
    assert_one_line_error(cli("trace", str(SEED), "--top", "-1"), "--top")
    assert_one_line_error(cli("recommend", str(SEED), "--headroom", "nan"), "--headroom")
    assert_one_line_error(cli("recommend", str(SEED), "--top", "0"), "--top")


def test_context_values_through_the_python_api():
    for kwargs in ({"learning_rate": float("nan")}, {"world_size": 2.5}, {"adam_betas": ("a", "b")},
                   {"max_grad_norm": -1}, {"sources": 5}):
        with pytest.raises(MemfitError):
            AutoContext(**kwargs)


def test_scenario_inputs_from_python_are_checked_like_flags(tiny):
    for bad in ({"seq_len": 100.5}, {"seq_len": float("nan")}, {"gradient_checkpointing": "maybe"},
                {"nodes": True}, {"gpus": ""}, {"peft_method": 5}, {"precision": "fp64"}):
        with pytest.raises(MemfitError):
            build_scenario(ScenarioInputs(model=str(tiny), **bad))
    sc = build_scenario(ScenarioInputs(model=str(tiny), gradient_checkpointing="no", seq_len="128"))
    assert sc.train.gradient_checkpointing is False and sc.train.seq_len == 128


def test_the_examples_still_plan_without_warnings():
    for path in sorted(EXAMPLES.glob("*.yaml")):
        r = cli("plan", str(path))
        assert r.rc == 0 and "warning" not in r.err, (path, r.err)
        assert os.path.basename(path)
