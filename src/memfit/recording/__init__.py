"""Recording real runs for ``memfit compare`` (needs torch): ``memfit.record`` (a context manager
for a plain loop), ``memfit.integrations.MemfitCallback`` (transformers' Trainer, TRL) and the GPU
validation kit (``memfit.recording.gpu_kit``)."""

from memfit.recording.recorder import Recorder, StepNamer, record

__all__ = ["Recorder", "StepNamer", "record"]
