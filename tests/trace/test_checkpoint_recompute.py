"""Gradient checkpointing: during the backward of a checkpointed block its activations are rebuilt
(non-reentrant ``torch.utils.checkpoint`` re-runs the block's forward when its first backward node
unpacks a saved tensor). The ledger adds ``recompute_bytes`` to each block's backward segment
(``memfit.core.ledger.deepspeed.step.ActivationPlan``); here against a fake-tensor trace of the model code
with checkpointing on (transformers' ``gradient_checkpointing_enable``, as the replay and the trace
run it).

Measured from the trace's step events: the recompute is what the activation side grows by from
the first to the last forward hook of the block's children inside the backward; the backward
segment's figure is the activation side after it. Shapes: 3 layers, hidden 384, sequence 96 and
200, bf16 (as tests/trace/test_activations_vs_trace.py).

Tolerances: next to each constant below (``pytest -s`` prints every row). LoRA blocks keep 3-5 x D x
t x h more in the recompute than the analytic per-block figure (15-23%), an activation-model matter
(memfit.core.activations.analytic) left out here.
"""

from __future__ import annotations

import pytest

from memfit.core.activations.analytic import estimate_activation_bytes
from memfit.core.ledger.deepspeed.step_activations import ActivationPlan
from memfit.core.model import ArchSpec
from memfit.core.peft.spec import PeftSpec
from memfit.trace.results import TraceOptions

H, HEADS, LAYERS, VOCAB = 384, 6, 3, 2000
CASES = {
    "llama": (dict(model_type="llama", vocab_size=VOCAB, hidden_size=H, intermediate_size=1024,
                   num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=2,
                   max_position_embeddings=1024),
              ArchSpec(model_type="llama", num_layers=LAYERS, hidden_size=H, num_heads=HEADS, num_kv_heads=2,
                       head_dim=H // HEADS, intermediate_size=1024, vocab_size=VOCAB, mlp_kind="gated"),
              "model.layers."),
    "gptj": (dict(model_type="gptj", vocab_size=VOCAB, n_embd=H, n_layer=LAYERS, n_head=HEADS,
                  rotary_dim=H // HEADS // 4, n_positions=1024),
             ArchSpec(model_type="gptj", num_layers=LAYERS, hidden_size=H, num_heads=HEADS, num_kv_heads=HEADS,
                      head_dim=H // HEADS, intermediate_size=4 * H, vocab_size=VOCAB),
             "transformer.h."),
    "gpt2": (dict(model_type="gpt2", vocab_size=VOCAB, n_embd=H, n_layer=LAYERS, n_head=HEADS, n_positions=1024),
             ArchSpec(model_type="gpt2", num_layers=LAYERS, hidden_size=H, num_heads=HEADS, num_kv_heads=HEADS,
                      head_dim=H // HEADS, intermediate_size=4 * H, vocab_size=VOCAB),
             "transformer.h."),
}
TOL_RECOMPUTE = 0.09
"""The recompute alone, full fine-tuning. Not modelled: the block's output while its forward is
re-run, a D x t x h tensor the block's saved set does not hold (Llama: 73,752 B = 2 x 96 x 384 +
24 B above the ledger at s=96; GPT-J -0.3%, GPT-2 +3.4%). Worst observed -4.471% (Llama, s=96,
every block; s=200 -4.470%); 2x that."""
TOL_SEGMENT = 0.136
"""The activations of a block's backward segment, its recompute included: the recompute's gap above
plus the activation gradients in flight (another D x t x h). Worst observed -6.784% (Llama, s=96,
block 0; s=200 -6.783%); 2x that. GPT-2 is left out (see the test)."""


def _measure(family: str, seq: int):
    from memfit.trace.step import trace_training_step

    config, arch, prefix = CASES[family]
    spec = PeftSpec(method="full")
    trace = trace_training_step(config, spec, TraceOptions(seq_len=seq, micro_batch=1, dtype="bf16",
                                                           gradient_checkpointing=True, granularity_bytes=1))
    est = estimate_activation_bytes(arch, spec, seq_len=seq, micro_batch=1, dtype_bytes=2,
                                    gradient_checkpointing=True)
    n_seg = 2 * LAYERS + 1
    plan = ActivationPlan(est, LAYERS, n_seg, 2, True, LAYERS)
    live, segment = est.total_bytes, []
    for s in range(n_seg + 1):  # activations live in each backward segment, its recompute included
        live += sum(b for _, b in plan.bwd_pre[s])  # the loss's backward (the head's segment)
        segment.append(live + plan.recompute[s])
        live += sum(b for _, b in plan.bwd_free[s])
    names = [m.name for m in trace.modules]
    events = trace.events
    end_forward = next(i for i, e in enumerate(events) if e.kind == "end_forward")
    rows = []
    for k in range(LAYERS):
        block = next(n for n in names if n.endswith(prefix + str(k)))
        inside = [i for i, e in enumerate(events) if i > end_forward and e.kind in ("fwd_pre", "fwd_post")
                  and names[e.module].startswith(block + ".")]
        assert inside, f"no recompute of {block} in the backward"
        first, last = events[inside[0]], events[inside[-1]]
        rows.append((last.act_bytes - first.act_bytes, last.act_bytes, segment[2 * (LAYERS - 1 - k) + 1]))
    return est, plan, rows


@pytest.mark.parametrize("family,seq", [("llama", 96),
                                        pytest.param("gptj", 96, marks=pytest.mark.slow),
                                        pytest.param("gpt2", 200, marks=pytest.mark.slow),
                                        pytest.param("llama", 200, marks=pytest.mark.slow)])
def test_backward_rebuilds_each_checkpointed_block(family, seq):
    est, plan, rows = _measure(family, seq)
    assert est.recompute_bytes > 0 and plan.recompute.count(est.recompute_bytes) == LAYERS
    for k, (rebuilt, after, ledger) in enumerate(rows):
        err = (est.recompute_bytes - rebuilt) / rebuilt
        print(f"\n{family} s={seq} block {k}: recompute trace {rebuilt:,} B, ledger {est.recompute_bytes:,} B "
              f"({err:+.1%}); activations after it: trace {after:,} B, ledger {ledger:,} B "
              f"({(ledger - after) / after:+.1%})")
        assert abs(err) <= TOL_RECOMPUTE
        if family != "gpt2":  # GPT-2 holds ~1.5 MB more through its blocks' backward that the activation model does not itemise
            assert abs(ledger - after) / after <= TOL_SEGMENT
            # without the recompute the backward would be short by a whole block
            assert abs(ledger - est.recompute_bytes - after) > abs(ledger - after)
