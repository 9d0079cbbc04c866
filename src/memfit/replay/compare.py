"""Prediction against measurement: the plan of a replayed scenario, item by item and phase by phase.

``scenario_of(measurement)`` rebuilds, with the pure core, the exact scenario a replay ran;
``compare(plan, measurement)`` lines up what the replay read off the library's objects and its peaks
per phase with the plan's; ``compare_replay(measurement)`` plans and compares in one call. Each
framework's rules are in its own folder: ``deepspeed/compare.py`` (DeepSpeed's buffers and their
pinned bytes, the CUDA placement) and ``pytorch/compare.py`` (torch, DDP, FSDP); the result types
are ``comparison.py``'s. No torch here: fixtures are compared in the core test suite without
running anything heavy.
"""

from __future__ import annotations

from collections.abc import Mapping

from memfit.core.ledger_types import Device, Plan, TracedStep
from memfit.core.scenario.types import Scenario
from memfit.replay.comparison import Comparison
from memfit.replay.measurement import Measurement


def _deepspeed(m: Measurement) -> bool:
    return getattr(m.spec, "framework", "deepspeed") == "deepspeed"


def scenario_of(m: Measurement) -> Scenario:
    """The scenario a replay ran, rebuilt with the pure core (no torch)."""
    if _deepspeed(m):
        from memfit.replay.deepspeed.compare import deepspeed_scenario_of

        return deepspeed_scenario_of(m)
    from memfit.replay.pytorch.compare import torch_scenario_of

    return torch_scenario_of(m)


def compare(plan: Plan, m: Measurement, *, sc: Scenario | None = None,
            placement_of: Mapping[str, Device] | None = None) -> Comparison:
    """``plan`` (of ``sc``, default ``scenario_of(m)``) against the replay ``m``; ``placement_of``
    (DeepSpeed): the CUDA placement of each ledger item (default: computed from ``sc``)."""
    if _deepspeed(m):
        from memfit.replay.deepspeed.compare import compare_deepspeed

        return compare_deepspeed(plan, m, sc=sc, placement_of=placement_of)
    from memfit.replay.pytorch.compare import compare_torch

    return compare_torch(plan, m)


def compare_replay(m: Measurement, traced: TracedStep | None = None) -> Comparison:
    """Plan the replay's scenario (with ``traced`` forward/backward items if given) and compare."""
    from memfit.core.plan import make_plan

    sc = scenario_of(m)
    if not _deepspeed(m):
        return compare(make_plan(sc, traced), m, sc=sc)
    from memfit.replay.deepspeed.compare import placement

    return compare(make_plan(sc, traced), m, sc=sc, placement_of=placement(sc, traced))
