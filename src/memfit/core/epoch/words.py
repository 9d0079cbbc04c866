"""The epoch simulation in words: what the plan's notes, the terminal and the reports say of it
(computed once here from the ``EpochSummary``; renderers print these lines)."""

from __future__ import annotations

from memfit.core.ledger_types import EpochSummary
from memfit.core.units import fmt_bytes


def epoch_lines(e: EpochSummary) -> tuple[str, ...]:
    if e.error:
        return (f"Epoch simulation not possible: {e.error}",)
    shape = f"{e.peak_micro_batch} x {e.peak_seq_len:,} tokens"
    out = [
        f"Epoch ({e.steps:,} optimizer steps of {e.per_epoch:,} per epoch, batching {e.rule}, "
        f"{e.distinct_lengths} batch lengths): reserved p50 {fmt_bytes(e.reserved_p50_bytes)}, "
        f"p99 {fmt_bytes(e.reserved_p99_bytes)}, max {fmt_bytes(e.reserved_max_bytes)}; OOM-relevant p50 "
        f"{fmt_bytes(e.oom_relevant_p50_bytes)}, p99 {fmt_bytes(e.oom_relevant_p99_bytes)}, max "
        f"{fmt_bytes(e.oom_relevant_max_bytes)} per rank.",
        f"Peak at step {e.peak_step:,} ({shape}); that shape is {e.peak_shape_steps:,} of the {e.steps:,} steps "
        f"({e.peak_shape_steps / e.steps:.1%}). Its phases are epoch.forward/backward/optimizer_step.",
        f"Batch lengths: {e.lengths_source}"
        + (f"; rounded up to multiples of {e.quantum} tokens" if e.quantum > 1 else "") + ".",
        f"Steps run through the allocator simulator: {e.simulated:,}; the same state and length again (not "
        f"re-run): {e.from_memo:,}" + (f"; past the event budget (the last figures of their length): "
                                       f"{e.approximated:,}" if e.approximated else "") + ".",
    ]
    if e.eval_figures is not None:
        out.append(f"Evaluations inside the epoch: reserved up to {fmt_bytes(e.eval_figures[0])}, OOM-relevant "
                   f"{fmt_bytes(e.eval_figures[1])}.")
    return tuple(out) + e.notes


def epoch_notes(e: EpochSummary) -> tuple[str, ...]:
    return epoch_lines(e)
