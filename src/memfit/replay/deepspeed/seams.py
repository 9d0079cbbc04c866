"""Where the replay cuts ``deepspeed.initialize`` into phases (DeepSpeed 0.19.8).

The child opens ``initialize.cast`` right before calling ``deepspeed.initialize``; the other
boundaries are DeepSpeed's own methods, wrapped only while ``initialize`` runs:

``initialize.cast``
    From the call until the engine moves the model: config parsing, ``_set_distributed_vars``,
    then ``DeepSpeedEngine._configure_distributed_model`` up to its ``self.module.to(self.device)``,
    which includes ``_cast_module_mixed_precision`` (engine.py: per-parameter
    ``p.data = p.data.to(fp16/bf16)``, skipped for zero.Init models).
``initialize.move``
    Opens when ``_configure_distributed_model`` calls ``self.module.to(self.device)`` (the replay
    sets a one-shot ``to`` on the model instance to see the call); if the engine skips the move
    (zero.Init model, ``dont_change_device``) it opens when ``_configure_distributed_model``
    returns, and is empty. Includes ``_broadcast_model``.
``initialize.partition``
    Opens when ``_configure_distributed_model`` returns. ZeRO-3: runs through
    ``DeepSpeedEngine._configure_basic_optimizer`` (the torch/DeepSpeedCPUAdam constructor: no
    state in 0.19.8) and the ``DeepSpeedZeRoOffload`` constructor (parameter_offload.py, which
    converts every parameter with ``partition_parameters.Init(module=...)``: ``_partition_param``
    allocates ceil(n/W) per parameter, pins it under offload_param, frees the full tensor).
    ZeRO-0/1/2 partition nothing here (their flat groups are cut inside the optimizer), so the phase
    ends at the entry of ``_configure_optimizer`` and is nearly empty.
``initialize.optimizer``
    ZeRO-3: opens when ``DeepSpeedZeRoOffload.__init__`` returns (fp16 flat partitions, fp32
    master partitions, their grads, ``grad_partitions_flat_buffer``, the reduce bucket, hooks).
    ZeRO-0/1/2: opens at the entry of ``DeepSpeedEngine._configure_optimizer`` (or of
    ``_configure_zero_optimizer``/``_configure_bf16_optimizer`` when the config has no optimizer),
    so it includes the basic optimizer constructor. Ends when ``deepspeed.initialize`` returns.

Phases the run skips are still opened, with zero length, in order, so every replay has all four.

``record_pins`` wraps ``get_accelerator().pin_memory``/``pin_empty``/``pin_empty_like`` for the
whole run so the host tracker can class the returned storages as pinned.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

from memfit.replay.phases import PhaseRecorder

INIT_PHASES = ("initialize.cast", "initialize.move", "initialize.partition", "initialize.optimizer")


class _InitPhases:
    def __init__(self, recorder: PhaseRecorder, zero_stage: int) -> None:
        self.recorder = recorder
        self.zero_stage = zero_stage
        self.reached = 0

    def advance(self, name: str) -> None:
        """Open ``name``, first opening (empty) any initialize phase skipped before it."""
        target = INIT_PHASES.index(name)
        while self.reached < target:
            self.reached += 1
            self.recorder.enter(INIT_PHASES[self.reached])

    def start(self) -> None:
        self.reached = 0
        self.recorder.enter(INIT_PHASES[0])


@contextlib.contextmanager
def initialize_phases(recorder: PhaseRecorder, *, zero_stage: int) -> Iterator[None]:
    """Mark the initialize sub-phases while the body calls ``deepspeed.initialize``."""
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.runtime.zero.parameter_offload import DeepSpeedZeRoOffload

    phases = _InitPhases(recorder, zero_stage)
    originals = {
        (DeepSpeedEngine, "_configure_distributed_model"): DeepSpeedEngine._configure_distributed_model,
        (DeepSpeedEngine, "_configure_optimizer"): DeepSpeedEngine._configure_optimizer,
        (DeepSpeedEngine, "_configure_zero_optimizer"): DeepSpeedEngine._configure_zero_optimizer,
        (DeepSpeedEngine, "_configure_bf16_optimizer"): DeepSpeedEngine._configure_bf16_optimizer,
        (DeepSpeedZeRoOffload, "__init__"): DeepSpeedZeRoOffload.__init__,
    }

    def configure_distributed_model(self, model):
        original_to = type(model).to

        @functools.wraps(original_to)
        def one_shot_to(*args, **kwargs):
            model.__dict__.pop("to", None)
            phases.advance("initialize.move")
            return original_to(model, *args, **kwargs)

        model.__dict__["to"] = one_shot_to
        try:
            result = originals[(DeepSpeedEngine, "_configure_distributed_model")](self, model)
        finally:
            model.__dict__.pop("to", None)
        phases.advance("initialize.move")
        phases.advance("initialize.partition")
        return result

    def optimizer_entry(key):
        def wrapper(self, *args, **kwargs):
            if zero_stage < 3:
                phases.advance("initialize.optimizer")
            return originals[key](self, *args, **kwargs)

        return wrapper

    def offload_init(self, *args, **kwargs):
        originals[(DeepSpeedZeRoOffload, "__init__")](self, *args, **kwargs)
        phases.advance("initialize.optimizer")

    replacements = {
        (DeepSpeedEngine, "_configure_distributed_model"): configure_distributed_model,
        (DeepSpeedEngine, "_configure_optimizer"): optimizer_entry((DeepSpeedEngine, "_configure_optimizer")),
        (DeepSpeedEngine, "_configure_zero_optimizer"): optimizer_entry((DeepSpeedEngine, "_configure_zero_optimizer")),
        (DeepSpeedEngine, "_configure_bf16_optimizer"): optimizer_entry((DeepSpeedEngine, "_configure_bf16_optimizer")),
        (DeepSpeedZeRoOffload, "__init__"): offload_init,
    }
    for (cls, name), fn in replacements.items():
        setattr(cls, name, fn)
    try:
        phases.start()
        yield
        phases.advance("initialize.optimizer")
    finally:
        for (cls, name), fn in originals.items():
            setattr(cls, name, fn)


@contextlib.contextmanager
def record_pins(note_pinned) -> Iterator[None]:
    """Call ``note_pinned(tensor)`` on every tensor DeepSpeed's accelerator pins (or would pin)."""
    from deepspeed.accelerator import get_accelerator

    accel = get_accelerator()
    names = [n for n in ("pin_memory", "pin_empty", "pin_empty_like") if hasattr(accel, n)]
    saved = {n: accel.__dict__.get(n) for n in names}
    for n in names:
        bound = getattr(accel, n)

        def wrapper(*args, _bound=bound, **kwargs):
            out = _bound(*args, **kwargs)
            note_pinned(out)
            return out

        setattr(accel, n, wrapper)
    try:
        yield
    finally:
        for n in names:
            if saved[n] is None:
                accel.__dict__.pop(n, None)
            else:
                setattr(accel, n, saved[n])
