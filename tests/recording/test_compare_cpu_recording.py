"""``memfit compare`` with a CPU recording from ``MemfitCallback`` (issue 23 item 11): the resident set
it recorded is compared with the plan's host figure per process, phase by phase, and the recording's
chart is scaled to the recording (not to the scenario's 80 GB GPU).

The recording is real: a tiny Llama trained 3 steps by transformers' Trainer on this CPU with the
callback, as a user would; the scenario is the same model (its config.json) planned as the
Trainer runs it."""

from __future__ import annotations

import json
import re

import pytest
from robustness.clirun import cli


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from memfit.integrations import MemfitCallback

    tmp = tmp_path_factory.mktemp("cpu-rec")
    cb = MemfitCallback(tmp / "rec")
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    (tmp / "model").mkdir()
    cfg.save_pretrained(tmp / "model")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    data = [{"input_ids": torch.randint(0, 128, (32,)), "labels": torch.randint(0, 128, (32,))} for _ in range(8)]
    args = transformers.TrainingArguments(output_dir=str(tmp / "out"), max_steps=3, per_device_train_batch_size=2,
                                          use_cpu=True, report_to=[], save_strategy="no", logging_steps=100,
                                          disable_tqdm=True, optim="adamw_torch")
    transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[cb]).train()
    (tmp / "scenario.yaml").write_text(
        f"name: tiny llama, Trainer on CPU\nmodel: {tmp / 'model'}\nframework: torch\noptim: adamw_torch\n"
        "train: {seq_len: 32, micro_batch: 2}\n")
    return tmp


def test_the_recorded_rss_is_compared_with_the_plans_host_figure(recorded):
    r = cli("compare", str(recorded / "scenario.yaml"), str(recorded / "rec"), "--json")
    assert r.rc == 0, r.err
    d = json.loads(r.out)
    rows = [p for p in d["phases"] if p["phase"] != "whole run"]
    stats = json.loads((recorded / "rec" / "stats.rank0.json").read_text())
    rss = {}
    for p in stats["phases"]:
        rss[p["name"]] = max(rss.get(p["name"], 0), p["rss_peak_bytes"])
    compared = [p for p in rows if p["host"]["recorded"]]
    assert {p["phase"] for p in compared} == set(rss)  # every recorded phase, none without a figure
    for p in compared:
        assert p["host"]["recorded"][0]["bytes"] == rss[p["phase"]]
        assert p["host"]["recorded"][0]["source"] == "process RSS"
        assert p["host"]["planned"]["bytes"] > 0 and p["host"]["diff_bytes"] is not None
    assert d["headline"]["host"]["name"] == "host RAM peak per node"
    text = cli("compare", str(recorded / "scenario.yaml"), str(recorded / "rec")).out
    assert "host RAM (process)" in text and "not recorded, so not compared: allocated (GPU)" in " ".join(text.split())


def test_the_chart_is_scaled_to_the_recording(recorded, tmp_path):
    page = tmp_path / "cmp.html"
    r = cli("compare", str(recorded / "scenario.yaml"), str(recorded / "rec"), "--report", str(page))
    assert r.rc == 0, r.err
    html = page.read_text()
    chart = html[html.index('id="recording-chart"'):]
    chart = chart[:chart.index("</svg>")]
    assert "host RAM, per process" in chart and "process RSS peak (memfit.record)" in chart
    ticks = [float(t) for t in re.findall(r'text-anchor="end">(\d+\.\d)</text>', chart)]
    d = json.loads(cli("compare", str(recorded / "scenario.yaml"), str(recorded / "rec"), "--json").out)
    drawn = [f["bytes"] for p in d["phases"] if p["phase"] != "whole run"
             for f in [p["host"]["planned"], *p["host"]["recorded"]] if f]
    top = max(drawn) / 2**30
    # the axis ends at the highest line drawn (8% above it), not at the host's 256 GB (nor the GPU's 80)
    assert top <= max(ticks) <= 1.08 * top + 0.05
    assert "above this chart" in chart  # the capacity is named, not drawn flat at the top
