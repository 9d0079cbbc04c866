"""``recommend`` under DeepSpeed: search the configurations a user can change for the ones that fit, rank them.

1. ``prepare`` resolves the user's scenario, reads their DeepSpeed JSON as written (``"auto"`` and
   all), sums the parameters once (``ScenarioAggregates``) and builds the search space.
2. ``search`` runs the fast estimator over every candidate and keeps those whose every phase stays
   under ``(1 - headroom)`` of the GPU (per rank), of the host RAM and of the NVMe space given (per
   node; NVMe bytes per rank x ranks per node, stricter than the verdict's per-rank check); they
   are ranked by estimated step time (``step_time``), and one candidate is kept per signature (stage,
   offloads, micro-batch, checkpointing): the one with the fewest changes among those within
   ``TIME_TOLERANCE`` of that signature's fastest.
3. ``recommend_deepspeed`` confirms the best of them with the exact ledger (``make_plan`` on the candidate's
   scenario, built from the patched JSON through ``build_scenario``), drops any the exact ledger
   does not confirm, and returns each with its patched JSON, script diff and plan.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from memfit.core.lean_dataclass import dataclass
from memfit.core.plan import make_plan
from memfit.core.recommend.deepspeed.aggregates import ScenarioAggregates
from memfit.core.recommend.confirm import (_fast_exact_diff, _fits, _limits, confirmation_order,
                                           enough_fitting, headroom_words, rank_by_level, rejection,
                                           rejection_notes)
from memfit.core.recommend.deepspeed.estimate import estimate_fitting_peaks, phase_names
from memfit.core.recommend.patch import (
    Change,
    candidate_inputs,
    claimed_mismatches,
    count_changes,
    describe_changes,
    patch_deepspeed_json,
)
from memfit.core.recommend.results import PhaseEstimate, Recommendation, RecommendResult
from memfit.core.recommend.script_diff import script_diff
from memfit.core.recommend.deepspeed.space import (
    Candidate,
    SearchSpace,
    base_candidate,
    enumerate_candidates,
    search_space,
)
from memfit.core.recommend.step_time import StepTime, estimate_step_time
from memfit.core.scenario.types import Scenario
from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.inputs import ScenarioInputs
from memfit.errors import MemfitError

TIME_TOLERANCE = 0.01
"""Within one signature, candidates this close (relative) to the fastest count as equally fast, and
the one with the fewest changes is shown."""
CONFIRM_FACTOR = 3
"""Candidates confirmed with the exact ledger: up to ``top x CONFIRM_FACTOR`` until ``top`` pass."""

Progress = Callable[[int, int], None]
"""``progress(done, total)``, called every few thousand candidates."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """The user's scenario ready for the search."""

    inputs: ScenarioInputs
    scenario: Scenario
    raw_json: dict[str, Any]
    """The user's DeepSpeed JSON as written ("auto" kept)."""
    aggregates: ScenarioAggregates
    base: Candidate
    space: SearchSpace
    valid: dict[tuple[int, str], bool]
    """(stage, precision) -> whether DeepSpeed accepts the user's config with them."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Scored:
    """A candidate that fits with headroom per the fast estimator."""

    candidate: Candidate
    peaks: tuple[tuple[int, int, int, int], ...]
    """Per phase (GPU, host per process, host per node, NVMe), from the fast estimator."""
    step_time: StepTime
    changes: tuple[Change, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchOutcome:
    """What ``search`` found with the fast estimator."""

    best: tuple[Scored, ...]
    """The best fitting candidate of each signature, fastest first, none that another makes
    redundant (``_dominates``)."""
    searched: int
    fitting: int
    """Candidates that fit every phase with the headroom."""
    seconds: float

    @property
    def candidates_per_second(self) -> float:
        return self.searched / self.seconds if self.seconds else 0.0


# --------------------------------------------------------------------------------------------


def _raw_json(inputs: ScenarioInputs, sc: Scenario) -> dict[str, Any]:
    if inputs.deepspeed:
        from memfit.core.reading import parse_json, read_text

        return parse_json(read_text(inputs.deepspeed, what="DeepSpeed config"), what=inputs.deepspeed)
    if inputs.deepspeed_inline is not None:
        return dict(inputs.deepspeed_inline)
    return dict(sc.deepspeed_json)  # memfit's default config (no "auto" in it)


def _stage3_limits(inputs: ScenarioInputs, raw: dict[str, Any], sc: Scenario) -> tuple[int, int, int]:
    """(prefetch, max live, persistence) the user's JSON gives under ZeRO-3 ("auto" resolves to the
    Trainer's hidden-size values only under ZeRO-3)."""
    z = sc.deepspeed.zero
    if z.stage == 3:
        return z.prefetch_bucket_size, z.max_live_parameters, z.param_persistence_threshold
    zo = raw.get("zero_optimization")
    probe = {**raw, "zero_optimization": {**(zo if isinstance(zo, dict) else {}), "stage": 3}}
    try:
        z3 = build_scenario(candidate_inputs(inputs, probe, base_candidate(sc, stage3_limits=(0, 0, 0)))).deepspeed.zero
    except MemfitError:
        from memfit.core.frameworks.deepspeed import ZeroSettings

        z3 = ZeroSettings(stage=3)
    return z3.prefetch_bucket_size, z3.max_live_parameters, z3.param_persistence_threshold


def prepare(inputs: ScenarioInputs) -> Prepared:
    """Resolve the scenario and set up the search (see the module docstring)."""
    sc = build_scenario(inputs)
    if sc.accelerator != "cuda":
        raise MemfitError("recommend searches GPU configurations: the scenario's accelerator must be cuda")
    if sc.quant.enabled:  # the estimator sizes params by numel x dtype; a 4-bit base is only in the ledger
        raise MemfitError("recommend does not search DeepSpeed with a 4-bit base yet; `memfit plan` plans it (or "
                          "recommend the scenario with framework torch, ddp, fsdp or fsdp2)")
    raw = _raw_json(inputs, sc)
    base = base_candidate(sc, stage3_limits=_stage3_limits(inputs, raw, sc))
    space = search_space(sc, base)
    valid: dict[tuple[int, str], bool] = {}
    for stage in space.stages:
        for precision in space.precisions:
            probe = replace(base, stage=stage, precision=precision, offload_optimizer="none", offload_param="none",
                            zero_init=False)
            try:
                build_scenario(candidate_inputs(inputs, patch_deepspeed_json(raw, sc, base, probe)[0], probe))
                valid[(stage, precision)] = True
            except MemfitError:
                valid[(stage, precision)] = False
    return Prepared(inputs=inputs, scenario=sc, raw_json=raw, aggregates=ScenarioAggregates.from_scenario(sc),
                    base=base, space=space, valid=valid)


def search(prep: Prepared, *, headroom: float | None = None, progress: Progress | None = None) -> SearchOutcome:
    """Every candidate through the fast estimator (see the module docstring)."""
    from memfit.core.recommend.confirm import check_headroom

    check_headroom(headroom)
    hw = prep.scenario.hardware
    limits = _limits(hw, headroom)
    agg = prep.aggregates
    base = prep.base
    valid = prep.valid
    fitting: dict[tuple, list[tuple]] = {}  # signature -> [(candidate, peaks, step time, changes)]
    t0 = time.perf_counter()
    candidates = enumerate_candidates(prep.space, allowed=lambda s, o, p, pr: valid[(s, pr)])
    if progress is not None:
        candidates = list(candidates)
    total = len(candidates) if progress is not None else 0
    n = 0
    for c in candidates:
        n += 1
        if progress is not None and n % 4096 == 0:
            progress(n, total)
        peaks = estimate_fitting_peaks(agg, c, limits)  # None: some phase over the limits
        if peaks is None:
            continue
        fitting.setdefault(c.signature, []).append((c, peaks, estimate_step_time(agg, c), count_changes(base, c)))
    elapsed = time.perf_counter() - t0
    if progress is not None:
        progress(n, total)
    best = []
    for group in fitting.values():
        fastest = min(t.total_s for _, _, t, _ in group)
        near = [g for g in group if g[2].total_s <= fastest * (1 + TIME_TOLERANCE)]
        # without --headroom, of equally fast variants the one the verdict calls "fits" (least at risk) wins
        c, peaks, step, _ = min(near, key=lambda g: (g[3], g[2].total_s) if headroom is not None else
                                (*_risk_key(g[1], hw), g[3], g[2].total_s))
        best.append(Scored(candidate=c, peaks=peaks, step_time=step, changes=describe_changes(base, c)))
    best.sort(key=lambda s: (s.step_time.total_s, len(s.changes)))
    kept: list[Scored] = []
    for s in best:
        if not any(_dominates(k, s) for k in kept):
            kept.append(s)
    return SearchOutcome(best=tuple(kept), searched=n, fitting=sum(len(g) for g in fitting.values()), seconds=elapsed)


def _risk_key(peaks, hw) -> tuple[bool, float]:  # noqa: ANN001
    """(at risk, how far into the band): fits before at risk, the least at risk first."""
    from memfit.core.recommend.confirm import risk_ratio

    r = risk_ratio(max(p[0] for p in peaks), max(p[2] for p in peaks), hw)
    return (r > 1.0, r if r > 1.0 else 0.0)


def _dominates(a: Scored, b: Scored) -> bool:
    """``a`` is as fast and needs as little GPU and host memory (each within ``TIME_TOLERANCE``) and
    makes a subset of ``b``'s changes: ``b`` adds changes for nothing."""
    def peak(s: Scored, i: int) -> int:
        return max(p[i] for p in s.peaks)
    tol = 1 + TIME_TOLERANCE
    return (a.step_time.total_s <= b.step_time.total_s * tol
            and {(c.setting, c.after) for c in a.changes} <= {(c.setting, c.after) for c in b.changes}
            and peak(a, 0) <= peak(b, 0) * tol and peak(a, 2) <= peak(b, 2) * tol)


def recommend_deepspeed(inputs: ScenarioInputs, *, top: int = 5, headroom: float | None = None,
                        progress: Progress | None = None) -> RecommendResult:
    """The ``top`` fastest configurations that fit every phase with ``headroom`` (see the module
    docstring), each confirmed by the exact ledger."""
    prep = prepare(inputs)
    sc, base, agg = prep.scenario, prep.base, prep.aggregates
    hw = sc.hardware
    gpu_limit, host_limit, _ = _limits(hw, headroom)
    found = search(prep, headroom=headroom, progress=progress)
    baseline = make_plan(sc)
    notes: list[str] = []
    recs: list[Recommendation] = []
    rejected: list[str] = []
    max_diff = 0
    order = list(found.best) if headroom is not None else confirmation_order(list(found.best), hw, lambda s: s.peaks)
    for s in order[: top * CONFIRM_FACTOR]:
        if enough_fitting(recs, top):
            break
        c = s.candidate
        patched, patch_notes = patch_deepspeed_json(prep.raw_json, sc, base, c)
        c_inputs = candidate_inputs(inputs, patched, c)
        c_sc = build_scenario(c_inputs)
        wrong = claimed_mismatches(c_sc, c)
        if wrong:  # a patching bug; never show a config that is not what it says
            notes.append(f"skipped a candidate whose patched config reads back differently: {'; '.join(wrong)}")
            continue
        plan = make_plan(c_sc)
        diff = _fast_exact_diff(s.peaks, plan)
        max_diff = max(max_diff, diff)
        if not _fits(plan, hw, headroom):
            rejected.append(rejection(plan, hw, headroom, diff))
            continue
        recs.append(Recommendation(
            rank=len(recs) + 1, candidate=c, changes=s.changes, step_time=s.step_time,
            fast_phases=tuple(PhaseEstimate(name=n, gpu_peak_bytes=g, cpu_peak_bytes=h, node_cpu_peak_bytes=nd,
                                            nvme_bytes=nv) for n, (g, h, nd, nv) in zip(phase_names(s.candidate), s.peaks)),
            plan=plan, deepspeed_json=patched, scenario_inputs=c_inputs,
            script_diff=script_diff(sc, prep.raw_json, base, c, model_ref=inputs.model or sc.model_ref,
                                    ds_name=Path(inputs.deepspeed).name if inputs.deepspeed else None),
            notes=patch_notes))
    recs = list(rank_by_level(recs, top, hw))
    notes += rejection_notes(rejected, hw, headroom)
    if not recs:
        notes.append(f"no configuration in the search space fits every phase with {headroom_words(hw, headroom)}; "
                     "try a smaller --headroom, more GPUs or host RAM, a shorter sequence, or a PEFT method")
    if sc.ds_version != "0.19":
        notes.append(f"configurations are for DeepSpeed {sc.ds_version}.x, as the scenario says; set "
                     "deepspeed_version: \"0.19\" for today's release")
    base_ok = _fits(baseline, hw, headroom)
    base_time = estimate_step_time(agg, base)
    return RecommendResult(
        scenario_name=sc.name, hardware=hw, headroom=headroom, gpu_limit_bytes=gpu_limit, host_limit_bytes=host_limit,
        baseline=baseline, baseline_fits_with_headroom=base_ok, baseline_step_time=base_time,
        recommendations=tuple(recs), candidates_searched=found.searched, candidates_fitting=found.fitting,
        search_seconds=found.seconds, candidates_per_second=found.candidates_per_second,
        max_fast_exact_diff_bytes=max_diff, notes=tuple(notes), headroom_words=headroom_words(hw, headroom),
        base_candidate=base, user_scenario=sc)
