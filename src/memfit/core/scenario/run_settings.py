"""The whole run beyond one step, resolved from the inputs: evaluation (``EvalSettings``) and the
epoch simulation (``EpochSettings``), each with what memfit assumed said out loud."""

from __future__ import annotations

from memfit.core.scenario.inputs import ScenarioInputs
from memfit.core.scenario.types import EpochSettings, EvalSettings, TrainSettings
from memfit.core.scenario.validate import positive_int
from memfit.errors import MemfitError


def eval_settings(inputs: ScenarioInputs, train: TrainSettings, model) -> EvalSettings:  # noqa: ANN001
    """``eval_strategy`` and the rest, as the Trainer reads them (transformers 5.24 ``TrainingArguments``
    and ``Seq2SeqTrainingArguments``: eval batch 8, greedy generation). ``generation_max_length`` is
    the length of the whole output: for an encoder-decoder every token of it is generated (the
    decoder starts from its start token); for a decoder-only model the prompt counts in it."""
    strategy = inputs.eval_strategy or "no"
    given = [k for k in ("eval_batch", "eval_seq_len", "eval_generate", "max_new_tokens", "generation_max_length",
                         "num_beams", "eval_steps") if getattr(inputs, k) is not None]
    if strategy == "no":
        if inputs.eval_generate:
            raise MemfitError("predict_with_generate is set but eval_strategy is no: the Trainer never evaluates "
                              "during training (set eval_strategy steps or epoch)")
        return EvalSettings(source=f"eval_strategy no: no evaluation phases (ignored: {', '.join(given)})"
                            if given else "")
    batch = positive_int(inputs.eval_batch, "eval_batch") if inputs.eval_batch is not None else 8
    seq = positive_int(inputs.eval_seq_len, "eval_seq_len") if inputs.eval_seq_len is not None else train.seq_len
    generate = bool(inputs.eval_generate)
    new = None
    if generate:
        encdec = bool(model.arch.num_encoder_layers)
        if inputs.max_new_tokens is not None and inputs.generation_max_length is not None:
            raise MemfitError("give either max_new_tokens or generation_max_length, not both")
        if inputs.max_new_tokens is not None:
            new = positive_int(inputs.max_new_tokens, "max_new_tokens")
        elif inputs.generation_max_length is not None:
            total = positive_int(inputs.generation_max_length, "generation_max_length")
            new = total if encdec else total - seq
            if new < 1:
                raise MemfitError(f"generation_max_length {total} leaves no new token after a {seq}-token prompt")
        else:
            raise MemfitError("predict_with_generate needs generation_max_length or max_new_tokens (the generation "
                              "config's default max_length of 20 is rarely what a run uses: say it)")
    beams = positive_int(inputs.num_beams, "num_beams") if inputs.num_beams is not None else 1
    steps = positive_int(inputs.eval_steps, "eval_steps") if inputs.eval_steps is not None else None
    parts = [f"eval_strategy {strategy}", f"per_device_eval_batch_size {batch}"
             + ("" if inputs.eval_batch is not None else " (the Trainer's default)"),
             f"inputs of {seq:,} tokens" + ("" if inputs.eval_seq_len is not None else " (the training length)")]
    if generate:
        parts.append(f"predict_with_generate: {new:,} new tokens, {beams} beam(s)"
                     + ("" if inputs.num_beams is not None else " (greedy: the default)"))
    return EvalSettings(strategy=strategy, batch=batch, seq_len=seq, generate=generate, max_new_tokens=new,
                        num_beams=beams, steps=steps, source="; ".join(parts))


def epoch_settings(inputs: ScenarioInputs, train: TrainSettings) -> EpochSettings:
    """The epoch simulation runs with a length distribution (``--lengths``) or when asked (``--epoch``;
    without a distribution memfit's default one, stated in the output)."""
    from memfit.core.batch_shapes import read_lengths

    simulate = inputs.epoch if inputs.epoch is not None else inputs.lengths is not None
    steps = positive_int(inputs.epoch_steps, "epoch_steps") if inputs.epoch_steps is not None else None
    empty = positive_int(inputs.empty_cache_steps, "empty_cache_steps") if inputs.empty_cache_steps is not None else None
    if not simulate:
        return EpochSettings(empty_cache_steps=empty, steps=steps)
    dist = read_lengths(inputs.lengths) if inputs.lengths is not None else None
    cap = None if inputs.max_seq_length is None else positive_int(inputs.max_seq_length, "max_seq_length")
    rule = inputs.batching or "pad-longest"
    if dist is None and rule == "pad-longest":
        cap = train.seq_len  # the default distribution is truncated at the planned length
    return EpochSettings(simulate=True, lengths=dist, default_lengths=dist is None, rule=rule,
                         max_seq_length=cap, steps=steps, empty_cache_steps=empty)
