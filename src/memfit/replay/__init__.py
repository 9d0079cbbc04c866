"""Replays: the referee that runs the real ``deepspeed.initialize`` and real training steps.

``run_replay(spec, timeout_s=...)`` runs a ``ReplaySpec`` in a supervised child process
(``python -m memfit.replay.child``) and returns a ``Measurement``: memory per phase (the phase names
of ``memfit.core.ledger_types.PHASES``), sizes read off DeepSpeed's objects, and the error, if any,
with the phase it happened in. The parent process never imports torch or deepspeed.

Modules: ``spec`` (what to run), ``measurement`` (what was measured; fixtures), ``runner`` (parent
side), ``supervision`` (supervised processes), ``child`` (the recipe; ``torch_child`` outside
DeepSpeed, ``child_common`` what both share), ``phases`` and ``seams`` (phase boundaries),
``host_tracker`` (byte-exact allocation timeline), ``attribution`` (sizes of DeepSpeed's buffers;
``torch_attribution`` of torch's objects), ``model_build`` (the real model plus PEFT),
``record_fixtures`` (the recorded cases).
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
