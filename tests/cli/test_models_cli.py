"""Issue 10 at the command line: models without remote code, task heads, encoder-decoders, batch
shapes, attention choices; bad input is one line and exit status 2."""

from __future__ import annotations

import json
import shutil

import pytest

from memfit.core.catalog import catalog_config_path, list_catalog

from test_cli import run


def model_dir(tmp_path, catalog_name: str, **changes):
    entry = next(e for e in list_catalog() if e.name == catalog_name)
    directory = tmp_path / catalog_name.replace("/", "--")
    directory.mkdir()
    if changes:
        config = json.loads(open(catalog_config_path(entry)).read())
        config.update(changes)
        (directory / "config.json").write_text(json.dumps(config))
    else:
        shutil.copy(catalog_config_path(entry), directory / "config.json")
    return directory


@pytest.mark.parametrize("name", ["google/mt5-base", "EleutherAI/pythia-1.4b"])
def test_plan_a_directory_holding_an_mt5_or_gpt_neox_config(tmp_path, name):
    r = run("plan", "--model", str(model_dir(tmp_path, name)), "--json", "--seq-len", "256")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["scenario"]["architecture"] in ("MT5ForConditionalGeneration", "GPTNeoXForCausalLM")
    assert "trust-remote-code" not in r.stdout + r.stderr


def test_encoder_decoder_target_length_and_task_heads(tmp_path):
    t5 = str(model_dir(tmp_path, "t5-base"))
    short = json.loads(run("plan", "--model", t5, "--json", "--seq-len", "512", "--target-len", "16").stdout)
    assert short["scenario"]["target_len"] == 16
    # the scenario carries the target length to the activation model (the ledger's step recipe passes
    # sc.train.target_len to estimate_activation_bytes: see the scenario API test below)
    from memfit.core.activations.analytic import estimate_activation_bytes
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.inputs import ScenarioInputs

    def activations(target):
        sc = build_scenario(ScenarioInputs(model=t5, seq_len=512, target_len=target))
        return estimate_activation_bytes(sc.model.arch, sc.peft, seq_len=sc.train.seq_len, micro_batch=1,
                                         dtype_bytes=2, target_len=sc.train.target_len).total_bytes

    assert activations(16) < activations(512) == activations(None)
    cls = json.loads(run("plan", "--model", t5, "--json", "--task", "sequence-classification").stdout)
    assert cls["scenario"]["architecture"] == "T5ForSequenceClassification"
    d = 768  # t5-base is tied (no lm_head); the classification head adds dense (d x d) and out_proj (2 x d)
    assert cls["params"]["total"] == short["params"]["total"] + d * d + d + 2 * d + 2
    bert = json.loads(run("plan", "--model", "bert-base-uncased", "--json", "--task", "token-classification").stdout)
    assert bert["scenario"]["architecture"] == "BertForTokenClassification"


def test_length_distribution_plans_the_longest_batch(tmp_path):
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(["100"] * 99 + ["1000"]))
    r = run("plan", "--model", "qwen-2.5-0.5b", "--lengths", str(lengths), "--micro-batch", "4", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["scenario"]["seq_len"] == 1000
    assert d["scenario"]["batch_shape"] == {"rule": "pad-longest", "micro_batch": 4, "seq_len": 1000,
                                            "probability": pytest.approx(0.04), "batches_per_epoch": 25}


@pytest.mark.parametrize(("args", "message"), [
    (("--model", "bigscience/bloom-7b1", "--attention", "sdpa"), "do not support attn_implementation='sdpa'"),
    (("--model", "gpt2", "--target-len", "8"), "target_len applies to encoder-decoder models"),
    (("--model", "t5-base", "--task", "causal-lm"), "no causal-lm class for model_type 't5'"),
    (("--model", "gpt2", "--task", "summarize"), "--task: invalid value 'summarize'; valid: causal-lm"),
    (("--model", "gpt2", "--batching", "pack"), "batching needs a length distribution"),
])
def test_bad_inputs_are_one_line_with_exit_status_2(args, message):
    r = run("plan", *args)
    assert r.returncode == 2 and message in r.stderr
    assert r.stderr.count("\n") == 1 and len(r.stderr) < 400


def test_unknown_model_type_is_one_line_and_never_suggests_remote_code_for_shipped_types(tmp_path):
    (tmp_path / "acme").mkdir()
    (tmp_path / "acme" / "config.json").write_text(json.dumps({"model_type": "acme_lm", "hidden_size": 8}))
    r = run("plan", "--model", str(tmp_path / "acme"))
    assert r.returncode == 2 and "does not know" in r.stderr and r.stderr.count("\n") == 1
    phi3 = model_dir(tmp_path, "microsoft/Phi-3-mini-4k-instruct")  # auto_map in the published config
    r = run("plan", "--model", str(phi3), "--json")
    assert r.returncode == 0 and "trust-remote-code" not in r.stderr
    assert any("auto_map" in n for n in json.loads(r.stdout)["notes"])


@pytest.mark.slow
def test_exact_on_an_encoder_decoder_and_a_model_without_pure_builder(tmp_path):
    mt5 = model_dir(tmp_path, "google/mt5-base", num_layers=1, num_decoder_layers=1)
    r = run("plan", "--model", str(mt5), "--exact", "--seq-len", "32", "--target-len", "8", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert any("traced" in n and "MT5ForConditionalGeneration" in n for n in json.loads(r.stdout)["notes"])
    (tmp_path / "phi").mkdir()
    (tmp_path / "phi" / "config.json").write_text(json.dumps({
        "model_type": "phi", "architectures": ["PhiForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 1000}))
    r = run("plan", "--model", str(tmp_path / "phi"), "--seq-len", "32")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "no pure-Python builder" in r.stderr and "slower" in r.stderr  # said out loud, before the trace
    assert "Forward/backward traced" in " ".join(r.stdout.split())
