"""``memfit diagnose`` as a user meets it: terminal and JSON output, standard input, exit codes."""

import json
import os
import subprocess
import sys

from conftest import FIXTURES, ROOT, SEED

LOGS = FIXTURES / "logs"
GiB, MiB = 2**30, 2**20


def run(*args, stdin=None):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "160"}
    return subprocess.run([sys.executable, "-m", "memfit.cli", "diagnose", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, env=env, input=stdin)


def test_seed_move_oom_with_the_seed_scenario():
    r = run("--log", str(LOGS / "seed-move-oom-ds0510.txt"), str(SEED))
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "initialize.move" in out and "_configure_distributed_model" in out
    assert "Log vs plan" in out and "whole model on the GPU" in out
    assert "another rank" in out


def test_json_without_scenario():
    r = run("--log", str(LOGS / "torch2-backward-oom-ds0198.txt"), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    p = d["primary"]
    assert p["kind"] == "gpu_oom" and p["rank"] == 0 and p["gpu_index"] == 0
    assert p["numbers"]["allocated_bytes"] == round(22.91 * GiB)
    assert p["numbers"]["tried_to_allocate_bytes"] == 2 * MiB
    assert d["phase"] == "backward" and d["phase_source"] == "traceback"
    assert d["reconciliation"] is None
    assert [e["rank"] for e in d["events"]] == [0, 1]
    assert {f["id"] for f in d["findings"]} >= {"log-gpu-oom"}


def test_json_with_scenario_reconciles_pinned_bytes():
    r = run("--log", str(LOGS / "seed-pinned-partition-ds0510.txt"), str(SEED), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    rec = d["reconciliation"]
    assert d["primary"]["kind"] == "pinned_host_oom"
    assert rec["phase"] == "initialize.partition" and rec["device"] == "cpu"
    assert rec["plan_verdict"] in ("predicted", "predicted_elsewhere", "not_predicted")
    assert any(it["device"] == "cpu_pinned" for it in rec["items"])
    assert all(isinstance(row["plan_bytes"], (int, type(None))) for row in rec["rows"])


def test_log_from_standard_input():
    text = (LOGS / "nccl-shm-system-error.txt").read_text()
    r = run("--log", "-", "--json", stdin=text)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["primary"]["kind"] == "nccl_error"


def test_missing_log_file_is_exit_2_one_line(tmp_path):
    r = run("--log", str(tmp_path / "nope.txt"))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"memfit: error: log file not found: {tmp_path / 'nope.txt'}"]
    assert "Traceback" not in r.stderr


def test_empty_and_unrecognised_logs_are_exit_1_one_line(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    noise = tmp_path / "noise.txt"
    noise.write_text("epoch 1: loss 2.31\nepoch 2: loss 2.05\nsaved checkpoint\n")
    for path, words in ((empty, "the log is empty"), (noise, "no recognisable error")):
        r = run("--log", str(path), str(SEED))
        assert r.returncode == 1
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0] and str(path) in lines[0]
        assert r.stdout == ""


def test_help_lists_diagnose():
    r = subprocess.run([sys.executable, "-m", "memfit.cli", "--help"], capture_output=True, text=True, cwd=ROOT,
                       timeout=60, env={**os.environ, "COLUMNS": "160"})
    assert r.returncode == 0 and "diagnose" in r.stdout
