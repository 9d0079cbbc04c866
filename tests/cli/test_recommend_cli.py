"""`memfit recommend` as a user meets it: the ranked table, --json, --out files, one-line errors."""

import json
import subprocess
import sys
from pathlib import Path

from conftest import EXAMPLES, ROOT, SEED

LLAMA2_LORA = EXAMPLES / "llama2-7b-lora-1x24gb.yaml"


def run(*args, cwd=ROOT):
    import os

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "100"}
    return subprocess.run([sys.executable, "-m", "memfit.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=180, env=env)


def test_recommend_table_and_files(tmp_path):
    out = tmp_path / "recs"
    r = run("recommend", str(LLAMA2_LORA), "--top", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "what changes" in text and "est." in text and "GPU" in text and "host" in text
    assert "gradient checkpointing false->true" in text
    assert "does not fit (GPU in phase forward)" in text
    folders = sorted(p.name for p in out.iterdir())
    assert [f.split("-")[0] for f in folders] == ["rank1", "rank2"]
    for folder in folders:
        names = {p.name for p in (out / folder).iterdir()}
        assert "scenario.yaml" in names and "train.py.diff" in names, names
        # a scenario file written by recommend is a scenario `memfit plan` reads, and it fits
        plan = run("plan", str(out / folder / "scenario.yaml"), "--json")
        assert plan.returncode == 0, plan.stderr
        assert json.loads(plan.stdout)["verdict"]["fits"] is True


def test_recommend_never_overwrites(tmp_path):
    out = tmp_path / "recs"
    assert run("recommend", str(SEED), "--top", "1", "--out", str(out)).returncode == 0
    before = {str(p): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    r = run("recommend", str(SEED), "--top", "1", "--out", str(out))
    assert r.returncode == 2
    assert r.stderr.startswith("memfit: error:") and "never overwrites" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert {str(p): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_recommend_json():
    r = run("recommend", str(SEED), "--top", "2", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert set(d) >= {"scenario", "baseline", "search", "recommendations", "notes"}
    assert d["search"]["candidates"] > 1000 and d["search"]["max_fast_exact_diff_bytes"] == 0
    rec = d["recommendations"][0]
    assert rec["rank"] == 1 and rec["fits"] is True and rec["changes"]
    assert rec["phases"][0]["name"] == "load"
    assert all(p["gpu_peak_bytes"] == p["fast_gpu_peak_bytes"] for p in rec["phases"])
    assert rec["deepspeed_json"]["zero_optimization"]["stage"] == rec["settings"]["stage"]
    assert isinstance(rec["est_step"]["total_seconds"], float)  # time-ok: the estimate's type, not a measured time
    assert rec["plan"]["verdict"]["fits"] is True and rec["plan"]["phases"][0]["items"]  # its whole ledger


def test_recommend_bad_headroom_is_one_line():
    r = run("recommend", str(SEED), "--headroom", "1.5")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "headroom" in r.stderr


def test_recommend_in_help():
    r = run("--help")
    assert r.returncode == 0 and "recommend" in r.stdout
