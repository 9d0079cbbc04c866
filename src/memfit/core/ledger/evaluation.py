"""The Trainer's evaluation during training: ``eval.forward`` and ``eval.generate`` (issue 19 item 2).

Written after the steady-state step (``step2.optimizer_step``), before ``save``: the run evaluates
between steps, with the params and the optimizer states alive and the gradients freed
(``zero_grad(set_to_none=True)``). Every framework calls ``record_evaluation`` from its build with
what only it knows: the dtypes its forward computes in and the params it holds gathered while a
forward runs (ZeRO-3's coordinator, FSDP's unsharded units); the rest is the same model code.

- ``eval.forward``: ``Trainer.evaluate`` -> ``evaluation_loop`` -> ``prediction_step``: the model in
  eval mode, ``torch.no_grad()``, one batch of ``per_device_eval_batch_size`` with labels (the loss),
  layer by layer (``core/activations/inference.py:no_grad_forward``). With ``compute_metrics`` the
  loop also keeps every batch's logits on the GPU until the end of the evaluation (``all_preds.add``,
  moved to the host only every ``eval_accumulation_steps``): not counted here, and said so.
- ``eval.generate``: ``Seq2SeqTrainer.prediction_step`` with ``predict_with_generate`` (which
  generates only with ``compute_metrics``): ``generate`` on the same batch
  (``core/activations/inference.py``: prefill, then the decode steps, the KV cache growing by
  ``torch.cat``; beam search's reorder copies and scores); an encoder-decoder's labels then go
  through the loss forward. The decode steps are written
  ``GENERATE_STEPS`` at a time at most (each adds several tokens), so the event count stays bounded;
  the cache's last step, its peak, is exact in size.
"""

from __future__ import annotations

from memfit.core.activations.inference import generate_shape, no_grad_forward, no_grad_layer_bytes
from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger_types import Device
from memfit.core.scenario.types import Scenario

WORK = "eval.working_set"
HEAD = "eval.logits_and_loss"
GATHER = "eval.gathered_params"
ENC = "eval.encoder_outputs"
KV = "eval.kv_cache"
STEP = "eval.step_logits"
GENERATE_STEPS = 16
"""Decode steps written one by one at most; longer generations add ceil(new / 16) tokens per step."""
GEN = "transformers 5.24 generation/utils.py"


def record_evaluation(t: Timeline, sc: Scenario, *, dtype_bytes: int, logits_bytes: int, gathered_bytes: int = 0,
                      gathered_formula: str = "", gathered_source: str = "") -> None:
    """Both evaluation phases (see the module docstring); nothing when the run does not evaluate."""
    ev = sc.eval
    if not ev.enabled:
        return
    arch = sc.model.arch
    b, s = ev.batch, ev.seq_len or sc.train.seq_len
    att = sc.train.attention
    fwd = no_grad_forward(arch, rows=b, seq_len=s, target_len=sc.train.target_len, dtype_bytes=dtype_bytes,
                          logits_bytes=logits_bytes, attention=att)
    t.declare(WORK, name="one layer's tensors while it runs without gradients (evaluation)", device=Device.GPU,
              category="activations", exact=False, formula=fwd.formula,
              source="memfit.core.activations.inference (no_grad: autograd saves nothing)")
    t.declare(HEAD, name="eval logits, the loss's fp32 copy and log-softmax", device=Device.GPU, category="activations",
              exact=False, formula=" + ".join(f"{n:,}" for n in fwd.head_bytes) + " B" if fwd.head_bytes else "none",
              source="transformers 5.24 trainer.py:prediction_step; loss/loss_utils.py:ForCausalLMLoss")
    if gathered_bytes:
        t.declare(GATHER, name="params gathered while the eval forward runs", device=Device.GPU, category="params",
                  exact=False, formula=gathered_formula, source=gathered_source)
    t.declare(ENC, name="encoder output (expanded per beam in generate)", device=Device.GPU, category="activations",
              exact=False, formula="rows x encoder length x hidden x B", source=f"{GEN}:_expand_inputs_for_generation")
    t.phase("eval.forward", f"Trainer.evaluate(): prediction_step under torch.no_grad, {b} x {s:,} tokens "
            "(per_device_eval_batch_size), optimizer states alive")
    t.alloc(GATHER, gathered_bytes)
    _forward(t, arch, fwd)
    t.free(GATHER)
    if ev.generate:
        t.phase("eval.generate", f"Seq2SeqTrainer.prediction_step: generate, {b} x {ev.num_beams} beam(s), "
                f"{s:,}-token inputs, {ev.max_new_tokens:,} new tokens (DynamicCache)")
        t.alloc(GATHER, gathered_bytes)
        _generate(t, sc, dtype_bytes=dtype_bytes, logits_bytes=logits_bytes)
        if arch.num_encoder_layers:  # Seq2SeqTrainer.prediction_step: then the loss on the labels
            _forward(t, arch, fwd)
        t.free(GATHER)


def _forward(t: Timeline, arch, fwd) -> None:  # noqa: ANN001
    for _ in range(arch.num_encoder_layers):
        t.alloc(WORK, fwd.encoder_layer_bytes)
        t.free(WORK, fwd.encoder_layer_bytes)
    t.alloc(ENC, fwd.encoder_output_bytes)
    for _ in range(arch.num_layers):
        t.alloc(WORK, fwd.layer_bytes)
        t.free(WORK, fwd.layer_bytes)
    for n in fwd.head_bytes:
        t.alloc(HEAD, n)
    t.free(HEAD)
    t.free(ENC)


def _generate(t: Timeline, sc: Scenario, *, dtype_bytes: int, logits_bytes: int) -> None:
    ev, arch = sc.eval, sc.model.arch
    b, s, k, new = ev.batch, ev.seq_len or sc.train.seq_len, ev.num_beams, ev.max_new_tokens or 1
    g = generate_shape(arch, batch=b, prompt=s, new_tokens=new, beams=k, dtype_bytes=dtype_bytes)
    encdec = arch.num_encoder_layers > 0
    att = sc.train.attention
    t.declare(KV, name="KV cache (DynamicCache: a key and a value per layer, grown by torch.cat)", device=Device.GPU,
              category="activations",
              formula=(f"{g.layers} layers x 2 x {g.rows} rows x {g.kv_bytes_per_token // max(g.rows, 1):,} B per token"
                       f" x ({'' if encdec else f'{s:,} prompt + '}{new:,} new tokens)"
                       + (f" + cross-attention {g.layers} x 2 x {g.cross_bytes:,} B" if encdec else "")
                       + "; the step's torch.cat holds a layer's old and new tensor at once"
                       + ("; beam search's reorder copies each layer's" if k > 1 else "")),
              source="transformers 5.24 cache_utils.py:DynamicLayer.update (torch.cat); "
                     "EncoderDecoderCache; Cache.reorder_cache (index_select)")
    t.declare(STEP, name="a decode step's fp32 logits (and beam search's log-softmax and scores)", device=Device.GPU,
              category="activations", formula=f"{g.rows} rows x {g.vocab:,} x 4 B each",
              source=f"{GEN}:_sample / _beam_search (logits[:, -1].to(copy=True, dtype=float32); log_softmax)")
    # inputs expanded per beam; the encoder runs once on the batch, its output is expanded
    if encdec:
        enc_layer = no_grad_layer_bytes(arch, rows=b, tokens=s, kv_tokens=s, dtype_bytes=dtype_bytes, attention=att)
        for _ in range(arch.num_encoder_layers):
            t.alloc(WORK, enc_layer)
            t.free(WORK, enc_layer)
        one = b * s * arch.hidden_size * dtype_bytes
        t.alloc(ENC, one)
        t.alloc(ENC, one * k)
        t.free(ENC, one)
        length = 0
    else:  # the prefill: the prompt through every layer, each layer's cache made from it
        pre = no_grad_layer_bytes(arch, rows=g.rows, tokens=s, kv_tokens=s, dtype_bytes=dtype_bytes, attention=att)
        for _ in range(g.layers):
            t.alloc(WORK, pre)
            t.alloc(KV, g.kv_bytes_per_token * s)
            t.alloc(KV, g.kv_bytes_per_token * s)
            t.free(WORK, pre)
        t.alloc(HEAD, g.rows * arch.vocab_size * logits_bytes)  # logits_to_keep=1: the last position only
        length = s
    steps = min(new, GENERATE_STEPS)
    per = -(-new // steps)
    step_work = no_grad_layer_bytes(arch, rows=g.rows, tokens=1, kv_tokens=length + new, dtype_bytes=dtype_bytes,
                                    attention=att)
    done = 0
    while done < new:
        add = min(per, new - done)
        t.alloc(WORK, step_work)
        for layer in range(g.layers):
            if encdec and length == 0:  # the first step computes the cross-attention cache
                t.alloc(KV, g.cross_bytes)
                t.alloc(KV, g.cross_bytes)
            for _ in range(2):  # key, value: torch.cat([old, new]) then the old one dropped
                t.alloc(KV, g.kv_bytes_per_token * (length + add))
                t.free(KV, g.kv_bytes_per_token * length)
        t.free(WORK, step_work)
        t.free(HEAD)
        t.alloc(HEAD, g.rows * arch.vocab_size * logits_bytes)
        t.alloc(STEP, g.rows * g.vocab * 4)  # .to(copy=True, dtype=float32)
        if k > 1:
            t.alloc(STEP, g.rows * g.vocab * 4)  # log_softmax
            t.alloc(STEP, g.rows * g.vocab * 4)  # + running beam scores
            for _ in range(g.layers):  # reorder_cache: index_select copies, the old dropped
                for _ in range(2):
                    t.alloc(KV, g.kv_bytes_per_token * (length + add))
                    t.free(KV, g.kv_bytes_per_token * (length + add))
        t.free(STEP)
        length += add
        done += add
    t.free(HEAD)
    t.free(KV)
    t.free(ENC)


def eval_notes(sc: Scenario) -> tuple[str, ...]:
    """What the evaluation phases assume, said out loud."""
    ev = sc.eval
    if not ev.enabled:
        return (ev.source,) if ev.source else ()
    out = [f"Evaluation: {ev.source}. Counted: one eval batch's forward"
           + (" and its generate" if ev.generate else "") + "; with compute_metrics the Trainer also keeps every "
           "batch's logits on the GPU until the evaluation ends (eval_accumulation_steps moves them to the host), "
           "which is not counted."]
    if ev.generate and ev.max_new_tokens and ev.max_new_tokens > GENERATE_STEPS:
        out.append(f"generate's {ev.max_new_tokens:,} decode steps are written {GENERATE_STEPS} at a time "
                   f"({-(-ev.max_new_tokens // GENERATE_STEPS)} tokens each): the cache's sizes are exact at every "
                   "written step, the allocator sees fewer, larger steps than the run.")
    return tuple(out)
