"""The Trainer's evaluation, replayed for real inside the torch replay child (``eval.*`` phases).

After the training steps (params and optimizer states alive, gradients freed), with the model the
loop trained:

- ``eval.forward``: ``Seq2SeqTrainer.evaluate()`` (transformers' own code: ``evaluation_loop`` ->
  ``prediction_step`` under ``torch.no_grad``, the loss with labels, ``prediction_loss_only`` as
  without ``compute_metrics``) over one batch of ``batch`` rows;
- ``eval.generate``: the same with ``predict_with_generate`` (and ``compute_metrics``, without which
  ``evaluate()`` asks for the loss alone and never generates): ``model.generate`` (greedy or beam
  search, ``DynamicCache``) for exactly ``max_new_tokens`` tokens (``min_new_tokens`` equal to it, so a
  random model's end-of-sequence token cannot stop it early), then, for an encoder-decoder, the loss
  forward with its labels (a decoder-only model generates from its prompt, without labels).

The batch is made before each phase starts (the DataLoader's collated tensors are the run's input,
as the training loop's ids are made before its forward); the Trainer object is built before too.
"""

from __future__ import annotations

import tempfile
from typing import Any


class _Rows:
    """A map-style dataset of the eval rows (``default_data_collator`` stacks them)."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.rows[i]


def run_evaluation(recorder, model, spec, *, vocab: int, device) -> None:  # noqa: ANN001
    import torch
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments, default_data_collator

    ev = spec.evaluation
    b = int(ev.get("batch", 8))
    s = int(ev.get("seq_len") or spec.seq_len)
    gen = torch.Generator().manual_seed(spec.seed + 1)
    ids = torch.randint(0, vocab, (b, s), generator=gen)
    encdec = bool(getattr(model.config, "is_encoder_decoder", False))
    labels = torch.randint(0, vocab, (b, s), generator=gen) if encdec else ids  # the loop trains T5 at target = seq_len
    rows = _Rows([{"input_ids": ids[i], "labels": labels[i]} for i in range(b)])
    with tempfile.TemporaryDirectory() as out:
        def trainer(generate: bool) -> Seq2SeqTrainer:
            args = Seq2SeqTrainingArguments(output_dir=out, per_device_eval_batch_size=b, report_to=[],
                                            use_cpu=device.type == "cpu", predict_with_generate=generate,
                                            dataloader_num_workers=0, disable_tqdm=True)
            # predict_with_generate generates only when there are metrics to compute (evaluate() asks
            # for the loss alone otherwise): a run that generates has compute_metrics
            return Seq2SeqTrainer(model=model, args=args, data_collator=default_data_collator,
                                  compute_metrics=(lambda p: {}) if generate else None)

        t = trainer(False)
        recorder.enter("eval.forward")
        t.evaluate(eval_dataset=rows)
        if ev.get("generate"):
            new = int(ev["max_new_tokens"])
            if not encdec:  # a decoder-only model's labels are its prompt: generate from the prompt alone
                rows = _Rows([{"input_ids": ids[i]} for i in range(b)])
            t = trainer(True)
            if encdec and model.generation_config.decoder_start_token_id is None:
                model.generation_config.decoder_start_token_id = model.config.decoder_start_token_id or 0
            if model.generation_config.pad_token_id is None:
                model.generation_config.pad_token_id = 0
            recorder.enter("eval.generate")
            t.evaluate(eval_dataset=rows, max_new_tokens=new, min_new_tokens=new,
                       num_beams=int(ev.get("num_beams", 1)), do_sample=False)
        del t
    model.train()
