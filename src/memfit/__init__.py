"""memfit: will this training run fit in GPU and CPU memory, phase by phase, and why not.

The package is split in two:

- ``memfit.core`` (pure Python): model shapes, PEFT accounting, DeepSpeed config semantics, the
  memory ledger, verdicts and findings. It never imports torch, deepspeed, transformers or peft at
  module level, so ``memfit plan`` starts fast.
- ``memfit.exact``, ``memfit.trace``, ``memfit.replay`` (heavy): meta-device builds with
  transformers/peft, fake-tensor traces and real DeepSpeed replays. They import the core, never the
  other way round.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    """``memfit.check`` (the pre-flight check for training scripts) and ``memfit.record`` (recording a
real run) are imported on first use: they need torch."""
    if name in ("check", "MemfitCheckError", "MemfitWarning"):
        from memfit.exact import check as _check

        return getattr(_check, name)
    if name == "record":  # recording a real run for `memfit compare` (needs torch)
        from memfit.recording.recorder import record

        return record
    raise AttributeError(f"module 'memfit' has no attribute {name!r}")
