"""Replays: the referee that runs the real ``deepspeed.initialize`` and real training steps.

``run_replay(spec, timeout_s=...)`` runs a ``ReplaySpec`` in a supervised child process
(``python -m memfit.replay.child``) and returns a ``Measurement``: memory per phase (the phase names
of ``memfit.core.ledger_types.PHASES``), sizes read off DeepSpeed's objects, and the error, if any,
with the phase it happened in. The parent process never imports torch or deepspeed.

Modules: ``spec`` (what to run), ``measurement`` (what was measured; fixtures), ``runner`` (parent
side), ``supervision`` (supervised processes), ``child`` (the child's entry point; ``child_common`` what
every framework's recipe shares), ``phases`` (phase boundaries), ``host_tracker`` (byte-exact
allocation timeline), ``model_build`` (the real model plus PEFT), ``compare`` (plan vs measurement).
One folder per framework beside them: ``deepspeed/`` (the recipe, ``seams`` cutting
``deepspeed.initialize`` into phases, ``attribution`` of DeepSpeed's buffers, the coordinator log,
the recorded cases) and ``pytorch/`` (the torch loop, DDP, FSDP, bitsandbytes models, the sizes of
torch's objects, their recorded cases).
"""

from memfit.replay.measurement import Measurement, load_fixture, save_fixture
from memfit.replay.runner import run_replay
from memfit.replay.spec import ReplaySpec, override_layers, spec_from_scenario

__all__ = [
    "Measurement",
    "ReplaySpec",
    "load_fixture",
    "override_layers",
    "run_replay",
    "save_fixture",
    "spec_from_scenario",
]
