"""Every command takes the same inputs (issue 23: "recommend --model ... is No such option"): plan's
scenario flags are one list (``cli/common.py: _scenario_flags``) that ``scenario_command`` gives to plan,
trace, replay, recommend, diagnose and compare, as well as their scenario file; and each runs from the
flags alone."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "robustness"))
from clirun import assert_one_line_error, cli  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ("plan", "trace", "replay", "recommend", "diagnose", "compare")


def _options(command: str) -> set[str]:
    import typer.main

    from memfit.cli import app

    cmd = typer.main.get_command(app).commands[command]
    return {opt for p in cmd.params for opt in p.opts if opt.startswith("--")}


def test_every_command_has_every_scenario_flag():
    import inspect

    from memfit.cli.common import _flag_name, _scenario_flags

    flags = {_flag_name(p) for p in inspect.signature(_scenario_flags).parameters.values()}
    assert {"--model", "--peft", "--gpus", "--deepspeed", "--training-args", "--accelerate-config", "--bnb-config",
            "--cpu-ram", "--seq-len", "--precision"} <= flags
    for command in COMMANDS:
        missing = flags - _options(command)
        if command == "replay":  # its --accelerator says where the replay runs (cpu or cuda)
            missing -= {"--accelerator"}
        assert not missing, f"memfit {command} lacks {sorted(missing)}"


def test_recommend_from_flags():
    r = cli("recommend", "--model", "gpt2", "--gpus", "1xrtx3090", "--cpu-ram", "64GiB", "--seq-len", "256",
            "--top", "1", "--json")
    assert r.rc == 0, r.err
    assert json.loads(r.out)["recommendations"]


def test_diagnose_from_flags():
    log = ROOT / "tests" / "fixtures" / "logs" / "torch2-backward-oom-ds0198.txt"
    r = cli("diagnose", "--model", "gpt2", "--gpus", "1xrtx3090", "--cpu-ram", "64GiB", "--log", str(log), "--json")
    assert r.rc == 0, r.err
    assert json.loads(r.out)["primary"]


def test_compare_from_flags():
    rec = ROOT / "tests" / "fixtures" / "records" / "seed-synthetic"
    seed = ROOT / "examples" / "kogpt-prefix-zero3-offload.yaml"
    by_file = cli("compare", str(seed), str(rec), "--json")
    assert by_file.rc == 0, by_file.err
    # the same scenario as flags over the file: the first positional is the scenario (a .yaml)
    over = cli("compare", str(seed), str(rec), "--seq-len", "256", "--json")
    assert over.rc == 0, over.err
    # the scenario as flags only: every positional is a record
    flags = cli("compare", "--model", "gpt2", "--gpus", "1xrtx3090", "--cpu-ram", "64GiB", str(rec), "--json")
    assert flags.rc == 0, flags.err
    assert json.loads(flags.out)["scenario"] == "gpt2 (full)"


@pytest.mark.parametrize("command", ["recommend", "trace", "replay", "compare"])
def test_bad_flag_values_are_refused_alike(command):
    extra = {"compare": ["records-dir"], "replay": [], "trace": [], "recommend": []}[command]
    assert_one_line_error(cli(command, "--model", "gpt2", "--cpu-ram", "64", *extra), "'64' has no unit")


def test_a_flag_overriding_the_scenario_file_is_said(seed_yaml):
    r = cli("plan", str(seed_yaml), "--seq-len", "256", "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["scenario"]["seq_len"] == 256
    assert any(n.startswith("--seq-len 256 overrides") and "train.seq_len" in n for n in doc["notes"]), doc["notes"]
