"""--torch-version / --alloc-conf / runtime: in YAML, through the command line: exit codes, one-line
errors, and the environment read only when asked."""

import json

import pytest

from conftest import SEED
from test_cli import run


@pytest.mark.parametrize("args, msg", [
    (["--torch-version", "1.9"], "unknown torch version '1.9'"),
    (["--torch-version", "banana"], "unknown torch version"),
    (["--alloc-conf", "expandable_segments:yes", "--torch-version", "2.13"], "True or False"),
    (["--alloc-conf", "expandable_segments:True", "--torch-version", "2.0"], "not known to torch 2.0"),
    (["--alloc-conf", "max_split_size_mb:5"], "too small"),
    (["--alloc-conf", "nonsense"], "unknown option 'nonsense'"),
    (["--alloc-conf", "expandable_segments", "--torch-version", "2.13"], "needs a value"),
    (["--pin-memory-backend", "native"], "DeepSpeed 0.19 only"),
])
def test_bad_runtime_input_is_one_line_exit_2(args, msg):
    r = run("plan", str(SEED), *args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and msg in lines[0] and "Traceback" not in r.stderr


def test_yaml_runtime_section(tmp_path):
    y = tmp_path / "s.yaml"
    seed = SEED.read_text(encoding="utf-8").replace('  torch: "1.10.1+cu113"', "")  # the runtime section names it
    y.write_text(seed.replace("deepspeed: deepspeed/", f"deepspeed: {SEED.parent}/deepspeed/")
                 + 'runtime: {torch_version: "1.10", alloc_conf: "max_split_size_mb:128"}\n', encoding="utf-8")
    d = json.loads(run("plan", str(y), "--json").stdout)
    assert d["scenario"]["torch_version"] == "1.10" and d["scenario"]["alloc_conf"] == "max_split_size_mb:128"
    assert d["scenario"]["cuda_version"] == "11.3"
    bad = tmp_path / "b.yaml"
    bad.write_text(y.read_text(encoding="utf-8").replace("torch_version", "torch_verison"), encoding="utf-8")
    r = run("plan", str(bad))
    assert r.returncode == 2 and "unknown key(s) in 'runtime': torch_verison" in r.stderr


def test_environment_is_read_only_when_asked():
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    today = ("--torch-version", "2.13")  # expandable_segments needs torch >= 2.1 (the seed states 1.10)
    plain = json.loads(run("plan", str(SEED), "--json", *today, env=env).stdout)
    asked = json.loads(run("plan", str(SEED), "--json", "--alloc-conf-from-env", *today, env=env).stdout)
    assert plain["scenario"]["alloc_conf"] == "" and "unset" in plain["notes"][1]
    assert asked["scenario"]["alloc_conf"] == "expandable_segments:True"
    assert "from the environment" in asked["notes"][1]
    r = run("plan", str(SEED), "--alloc-conf-from-env", env={"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:2"})
    assert r.returncode == 2 and "garbage_collection_threshold" in r.stderr


def test_terminal_shows_the_allocator_figures():
    r = run("plan", str(SEED), "--torch-version", "1.10", env={"COLUMNS": "120"})
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    for word in ("alloc", "resv", "OOM", "lock", "GiB (2^30 bytes)", "OOM-relevant"):
        assert word in out
    assert "torch 1.10's caching allocators" in out
