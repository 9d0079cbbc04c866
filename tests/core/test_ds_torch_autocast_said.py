"""DeepSpeed's torch_autocast section, enabled, is said out loud (issue 26): memfit's DeepSpeed ledger
counts the activations in the params' dtype (it passes no autocast compute dtype), so a config that
turns autocast on gets a one-line warning instead of a silent plan without it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CATALOG = Path(__file__).resolve().parents[2] / "src" / "memfit" / "catalog"


def _plan(tmp_path, autocast: dict | None) -> subprocess.CompletedProcess:
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}
    if autocast is not None:
        cfg["torch_autocast"] = autocast
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    return subprocess.run([sys.executable, "-m", "memfit.cli", "plan", "--model", str(CATALOG / "EleutherAI--pythia-1b.json"),
                           "--deepspeed", str(path), "--load-dtype", "fp32", "--json"], capture_output=True, text=True, check=True)


def test_enabled_torch_autocast_is_said(tmp_path):
    out = _plan(tmp_path, {"enabled": True, "dtype": "bfloat16"})
    assert "torch_autocast is enabled" in out.stderr and "torch_autocast is enabled" in out.stdout


def test_disabled_or_absent_torch_autocast_says_nothing(tmp_path):
    for autocast in (None, {"enabled": False}):
        assert "torch_autocast" not in _plan(tmp_path, autocast).stderr
