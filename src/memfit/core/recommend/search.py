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
    from dataclasses import replace

    from memfit.core.recommend.confirm import check_headroom

    check_headroom(headroom)
    from memfit.core.frameworks.resolve import apply_input_files

    merged = apply_input_files(inputs)  # the user's TrainingArguments/accelerate/bnb files read in
    if build_scenario(merged).framework != "deepspeed":
        from memfit.core.recommend.pytorch.search import recommend_torch

        result = recommend_torch(merged, top=top, headroom=headroom, progress=progress,
                                 files=bool(inputs.training_args or inputs.accelerate_config),
                                 trainer=bool(inputs.training_args))
        from memfit.core.recommend.files import torch_script_change
        from memfit.core.recommend.user_files import read_user_files

        user_files = read_user_files(inputs)
        result = replace(result, user_inputs=inputs)
        result = replace(result, recommendations=tuple(
            replace(r, script_diff=torch_script_change(result, r, user_files)) for r in result.recommendations))
    else:
        from memfit.core.recommend.deepspeed.search import recommend_deepspeed

        result = recommend_deepspeed(merged, top=top, headroom=headroom, progress=progress)
    from memfit.core.recommend.files import with_file_diffs

    return with_file_diffs(replace(result, user_inputs=inputs))
