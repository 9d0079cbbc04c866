"""Integrations with training frameworks, imported on first use:

- ``MemfitCallback``: a transformers ``TrainerCallback`` (Trainer, TRL's trainers) that records
  memory per phase like ``memfit.record`` (``memfit.integrations.trainer``).
"""


def __getattr__(name: str):
    if name == "MemfitCallback":
        from memfit.integrations.trainer import MemfitCallback

        return MemfitCallback
    raise AttributeError(f"module 'memfit.integrations' has no attribute {name!r}")
