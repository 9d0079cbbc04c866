"""The evaluation phases against a CPU replay of the Trainer's own ``evaluate()`` and ``generate()``
(issue 19 item 2; slow: each case trains a tiny model for 2 steps, then evaluates).

``memfit.replay.pytorch.evaluation`` runs ``Seq2SeqTrainer.evaluate()`` on one eval batch
(``eval.forward``) and with ``predict_with_generate`` (``eval.generate``: ``model.generate`` with its
``DynamicCache``, greedy or beam search, then an encoder-decoder's loss) after the training steps,
measured by the replay's host tracker (torch.profiler's allocator reports: every tensor byte). The
plan of the same scenario on the CPU accelerator (``core/ledger/evaluation.py``) is compared phase
by phase: the params and optimizer states held through evaluation are exact, the rest is the
inference estimate (``core/activations/inference.py``), computed for CUDA kernels.
"""

from __future__ import annotations

import json
import os
import tempfile

import pytest

from memfit.core.plan import make_plan
from memfit.replay.compare import scenario_of
from memfit.replay.comparison import HOST, tensor_host_peak

pytestmark = pytest.mark.slow

TINY_T5 = {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"], "d_model": 64, "d_ff": 128, "d_kv": 16,
           "num_heads": 4, "num_layers": 2, "num_decoder_layers": 2, "vocab_size": 1000, "feed_forward_proj": "gated-gelu",
           "tie_word_embeddings": True, "decoder_start_token_id": 0, "pad_token_id": 0, "eos_token_id": 1,
           "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128}
"""Tied: transformers 5.24's T5Config forces tie_word_embeddings True (configuration_t5.py __post_init__),
while memfit's T5 builder keeps an untied head when the config says False (a difference outside evaluation)."""
EVAL_TOL_REL = 0.15
"""eval.forward / eval.generate host peak (everything live: params, optimizer states, evaluation),
plan vs replay, relative to the replay's. Worst observed -7.42% (T5 eval.generate: -336,376 B of
4,532,932 B, what the increment below misses); 2x that is 14.8%."""
EVAL_ADDED_TOL_REL = 0.48
"""What evaluation adds over the training state (the replay: its peak over the phase's start; the plan:
its eval.* items at the peak). Not modelled: the CPU kernels' extra tensors (sdpa's math path
materializes the scores and a float causal mask; RoPE's cos/sin per call; T5's scaled decoder output
and position bias), the evaluation loop's collated batch and repeated losses, generate's
input_ids/attention-mask growth. Observed: eval.forward -6.55% (Llama: the logits and log-softmax are
exact, -35,868 B of the loop's own tensors), generate -21.4% (greedy) and -21.7% (3 beams), T5 -24.02%
(-334,152 B of 1,390,920 B); 2x the worst is 48%."""


def _spec(name: str, model: dict, **ev):
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.inputs import ScenarioInputs
    from memfit.replay.spec import spec_from_scenario

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "config.json")
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(model, fh)
        inputs = ScenarioInputs(model=path, name=name, precision="fp32", optim="adamw_torch", framework="torch",
                                seq_len=32, micro_batch=2, accelerator="cpu", gpus="1x24GiB", cpu_ram="64GB", **ev)
        sc = build_scenario(inputs)
        return spec_from_scenario(sc, model_config=model, layers=None, steps=2, threads=2, name=name, save="never")


CASES = {
    "llama_eval_greedy": ("llama", dict(eval_strategy="steps", eval_batch=4, eval_generate=True, max_new_tokens=24)),
    "llama_eval_beams": ("llama", dict(eval_strategy="steps", eval_batch=2, eval_generate=True, max_new_tokens=16,
                                       num_beams=3)),
    "t5_eval_generate": ("t5", dict(eval_strategy="epoch", eval_batch=4, eval_generate=True, max_new_tokens=20,
                                    num_beams=2)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_eval_phases_against_the_trainer(name):
    pytest.importorskip("torch")
    from memfit.replay.deepspeed.record_fixtures import TINY_LLAMA
    from memfit.replay.runner import run_replay

    family, ev = CASES[name]
    model = dict(TINY_LLAMA, num_hidden_layers=4) if family == "llama" else TINY_T5
    m = run_replay(_spec(name, model, **ev), timeout_s=900)
    assert m.ok, f"{m.error.kind} in {m.error.phase}: {m.error.message}\n{m.error.traceback}"
    sc = scenario_of(m)
    assert sc.eval.enabled and sc.eval.generate
    plan = make_plan(sc)
    for phase in ("eval.forward", "eval.generate"):
        measured = m.peak(phase, "host_peak_bytes")
        assert measured, f"the replay has no {phase} phase"
        start = min(p.host_live_start_bytes for p in m.phase_occurrences(phase))
        planned = tensor_host_peak(plan, phase)
        added = sum(i.bytes for i in plan.phase(phase).items if i.key.startswith("eval.") and i.device in HOST)
        rel = (planned - measured) / measured
        inc_m, inc_p = measured - start, added
        inc_rel = (inc_p - inc_m) / inc_m
        print(f"{name} {phase}: plan {planned:,} B, replay {measured:,} B ({rel:+.2%}); what evaluation adds: "
              f"plan {inc_p:,} B, replay {inc_m:,} B ({inc_rel:+.2%})")
        assert abs(rel) <= EVAL_TOL_REL, f"{name} {phase}: plan {planned:,} B vs replay {measured:,} B ({rel:+.2%})"
        assert abs(inc_rel) <= EVAL_ADDED_TOL_REL, (f"{name} {phase}: what evaluation adds: plan {inc_p:,} B vs "
                                                    f"replay {inc_m:,} B ({inc_rel:+.2%})")
