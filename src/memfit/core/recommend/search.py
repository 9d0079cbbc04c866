"""``recommend``: the configurations a user can change that fit, ranked, searched by the recipes of the
run's framework: ``deepspeed/search.py`` (ZeRO stage, offloads, buckets, micro-batch, checkpointing
over the fast estimator) or ``pytorch/search.py`` (torch, DDP, FSDP/FSDP2: framework, precision,
optimizer, quantization, micro-batch, checkpointing)."""

from __future__ import annotations

from collections.abc import Callable

from memfit.core.recommend.results import RecommendResult
from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.inputs import ScenarioInputs
from memfit.errors import MemfitError

Progress = Callable[[int, int], None]
"""``progress(done, total)``, called every few thousand candidates."""


def recommend(inputs: ScenarioInputs, *, top: int = 5, headroom: float | None = None,
              progress: Progress | None = None) -> RecommendResult:
    """The ``top`` fastest configurations that fit every phase with ``headroom``, each confirmed by
    the exact ledger."""
    if top < 1:
        raise MemfitError(f"--top must be at least 1, got {top}")
    from memfit.core.recommend.confirm import check_headroom

    check_headroom(headroom)
    from memfit.core.frameworks.resolve import apply_input_files

    if build_scenario(apply_input_files(inputs)).framework != "deepspeed":
        from memfit.core.recommend.pytorch.search import recommend_torch

        return recommend_torch(inputs, top=top, headroom=headroom, progress=progress)
    from memfit.core.recommend.deepspeed.search import recommend_deepspeed

    return recommend_deepspeed(inputs, top=top, headroom=headroom, progress=progress)
