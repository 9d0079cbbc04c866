"""Evaluation phases in the plan (issue 19 item 2): read from the user's TrainingArguments /
Seq2SeqTrainingArguments / SFTConfig or flags, present only when the run evaluates, counted by the
verdict. Their sizes are checked against the Trainer's own evaluate() and generate() in
tests/replay/test_eval_vs_replay.py; here: the inputs, the phases and the exact parts (the KV cache's
bytes are the DynamicCache's tensors, to the byte)."""

from __future__ import annotations

import json

import pytest

from memfit.core.plan import make_plan
from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.inputs import ScenarioInputs
from memfit.errors import MemfitError

LLAMA = "meta-llama/Llama-2-7b-hf"


def _seq2seq_args(tmp_path, **extra) -> str:
    """Seq2SeqTrainingArguments as a run's script writes them (args.to_dict() keys that matter)."""
    d = {"output_dir": "out", "per_device_train_batch_size": 2, "per_device_eval_batch_size": 4,
         "eval_strategy": "steps", "eval_steps": 500, "predict_with_generate": True, "generation_max_length": 129,
         "generation_num_beams": 4, "bf16": True, "learning_rate": 1e-4, "logging_steps": 10, **extra}
    p = tmp_path / "args.json"
    p.write_text(json.dumps(d))
    return str(p)


def test_seq2seq_training_arguments_give_the_eval_phases(tmp_path):
    sc = build_scenario(ScenarioInputs(model="google-t5/t5-base", training_args=_seq2seq_args(tmp_path), seq_len=512,
                                       gpus="1xa100-80gb"))
    ev = sc.eval
    assert (ev.strategy, ev.batch, ev.generate, ev.max_new_tokens, ev.num_beams, ev.steps) == ("steps", 4, True, 129, 4, 500)
    plan = make_plan(sc)
    names = [p.name for p in plan.phases]
    assert names[-3:] == ["eval.forward", "eval.generate", "save"]
    assert any("Evaluation:" in n for n in plan.notes)


def test_no_eval_strategy_no_eval_phases(tmp_path):
    sc = build_scenario(ScenarioInputs(model="google-t5/t5-base", seq_len=512,
                                       training_args=_seq2seq_args(tmp_path, eval_strategy="no", predict_with_generate=False)))
    assert not sc.eval.enabled
    assert not [p for p in make_plan(sc).phases if p.name.startswith("eval.")]


def test_generate_without_a_length_is_refused():
    with pytest.raises(MemfitError, match="generation_max_length or max_new_tokens"):
        build_scenario(ScenarioInputs(model=LLAMA, eval_strategy="epoch", eval_generate=True))


def test_decoder_only_generation_max_length_counts_the_prompt():
    sc = build_scenario(ScenarioInputs(model=LLAMA, seq_len=512, eval_strategy="epoch", eval_generate=True,
                                       generation_max_length=640))
    assert sc.eval.max_new_tokens == 128
    with pytest.raises(MemfitError, match="leaves no new token"):
        build_scenario(ScenarioInputs(model=LLAMA, seq_len=512, eval_strategy="epoch", eval_generate=True,
                                      generation_max_length=512))


def test_the_kv_cache_is_dynamic_cache_s_tensors():
    """Llama-2-7B, 2 x 4 beams, 256 prompt + 64 new tokens: every layer's key and value are
    rows x kv_heads x length x head_dim x 2 B, to the byte, at generate's peak."""
    sc = build_scenario(ScenarioInputs(model=LLAMA, seq_len=256, micro_batch=1, eval_strategy="steps", eval_batch=2,
                                       eval_generate=True, max_new_tokens=64, num_beams=4, precision="bf16",
                                       load_dtype="bf16", framework="torch", gpus="1xa100-80gb"))
    ph = make_plan(sc).phase("eval.generate")
    kv = sum(i.bytes for i in ph.items if i.key == "eval.kv_cache")
    rows, layers, kv_heads, head_dim = 2 * 4, 32, 32, 128
    full = layers * 2 * rows * kv_heads * head_dim * (256 + 64) * 2
    # at the peak one layer's torch.cat holds its old and new key (or value) at once
    assert full <= kv <= full + rows * kv_heads * head_dim * (256 + 64) * 2


def test_the_verdict_counts_evaluation():
    """A run whose training steps fit but whose evaluation does not: the verdict fails in eval.*"""
    base = dict(model=LLAMA, seq_len=1024, micro_batch=1, precision="bf16", load_dtype="bf16", framework="torch",
                gpus="1xrtx4090", peft_method="lora", gradient_checkpointing=True)
    train_only = make_plan(build_scenario(ScenarioInputs(**base)))
    assert train_only.verdict.fits
    with_eval = make_plan(build_scenario(ScenarioInputs(**base, eval_strategy="steps", eval_batch=64)))
    assert not with_eval.verdict.fits
    assert {f.phase for f in with_eval.verdict.failures} <= {"eval.forward", "eval.generate"}
    assert with_eval.verdict.failures[0].phase == "eval.forward"


def test_scenario_file_eval_section(tmp_path):
    from memfit.core.scenario.read import read_scenario_file

    p = tmp_path / "s.yaml"
    p.write_text(f"model: {LLAMA}\ntrain: {{seq_len: 256}}\neval: {{strategy: epoch, batch: 2, generate: true, "
                 "max_new_tokens: 32, num_beams: 2}\n")
    sc = build_scenario(read_scenario_file(p))
    assert (sc.eval.strategy, sc.eval.batch, sc.eval.max_new_tokens, sc.eval.num_beams) == ("epoch", 2, 32, 2)
    p.write_text(f"model: {LLAMA}\neval: {{strategy: no}}\n")  # YAML's bare no is a boolean: read as "no"
    assert not build_scenario(read_scenario_file(p)).eval.enabled
    p.write_text(f"model: {LLAMA}\neval: {{strategy: sometimes}}\n")
    with pytest.raises(MemfitError, match=r"eval\.strategy"):
        build_scenario(read_scenario_file(p))
