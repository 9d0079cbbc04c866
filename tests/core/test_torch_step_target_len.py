"""The torch ledger's activations of an encoder-decoder follow its target length (issue 26).

transformers' T5 runs the decoder over the labels' tokens (``target_len``), not the encoder's: the
torch/DDP/FSDP step books each block stage at its own layer's figure of ``estimate_activation_bytes``
with that target (which tests/trace/test_activation_grid.py checks against a trace of the model's code
at targets 4 and 80), and the loss's logits at ``micro_batch x target_len`` rows. Before, the torch
ledger dropped ``target_len`` (T0_3B LoRA at labels of 4 tokens: +53% against the published run,
+8.5% after). Exact: the ledger's bookkeeping of the estimate, byte for byte.
"""

from __future__ import annotations

import json

import pytest

from memfit.core.activations.analytic import estimate_activation_bytes
from memfit.core.ledger.pytorch.params import build_torch_model
from memfit.core.ledger.pytorch.step_context import GradSink, build_step_context
from memfit.core.optimizers import resolve_optimizer
from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.inputs import ScenarioInputs

T5 = {"model_type": "t5", "vocab_size": 1000, "d_model": 64, "d_kv": 24, "d_ff": 160, "num_layers": 3, "num_heads": 4,
      "decoder_start_token_id": 0, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}


@pytest.mark.parametrize(("method", "target", "ckpt"), [("full", 4, False), ("lora", 4, False), ("full", 80, False),
                                                        ("full", 4, True), ("full", None, False)])
def test_the_torch_ledger_books_the_decoder_at_the_target_length(tmp_path, method, target, ckpt):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(T5), encoding="utf-8")
    sc = build_scenario(ScenarioInputs(model=str(path), framework="torch", precision="fp32", optim="adamw_torch",
                                       accelerator="cpu", seq_len=48, micro_batch=2, target_len=target,
                                       gradient_checkpointing=ckpt, peft_method=method, task="seq2seq-lm"))
    c = build_step_context(sc, build_torch_model(sc), resolve_optimizer(sc.torch, "cpu"), GradSink())
    est = estimate_activation_bytes(sc.model.arch, sc.peft, seq_len=48, micro_batch=2, dtype_bytes=4,
                                    gradient_checkpointing=ckpt, attention=sc.train.attention, target_len=target)
    blocks = [st.act for st in c.stages[1:-1]]
    assert len(blocks) == 6
    assert sum(st.act for st in c.stages) == est.total_bytes
    assert tuple(blocks) == est.per_layer_bytes()
    if ckpt:
        assert tuple(st.recompute for st in c.stages[1:-1]) == est.recompute_per_layer()
    if target is not None:
        assert blocks[3:] != blocks[:3]  # the decoder's blocks are not the encoder's
