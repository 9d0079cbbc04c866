"""What ``memfit recommend`` returns: each confirmed configuration (``Recommendation``) and the whole
answer (``RecommendResult``), for DeepSpeed (``deepspeed.search``) and for the other frameworks (``pytorch.search``)
alike; the renderers and ``files`` read them.
"""

from __future__ import annotations

from typing import Any

from memfit.core.lean_dataclass import dataclass
from memfit.core.hardware import Hardware
from memfit.core.ledger_types import Plan
from memfit.core.recommend.patch import Change
from memfit.core.recommend.deepspeed.space import Candidate
from memfit.core.recommend.step_time import StepTime
from memfit.core.scenario.inputs import ScenarioInputs


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseEstimate:
    """One phase's peaks from the fast estimator."""

    name: str
    gpu_peak_bytes: int
    """Per rank."""
    cpu_peak_bytes: int
    """Per process (pinned + pageable)."""
    node_cpu_peak_bytes: int
    """All ranks of one node (rank-0-only items once)."""
    nvme_bytes: int
    """Per rank, on NVMe."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Recommendation:
    """One configuration that fits, confirmed by the exact ledger."""

    rank: int
    candidate: Candidate
    changes: tuple[Change, ...]
    step_time: StepTime
    fast_phases: tuple[PhaseEstimate, ...]
    """The fast estimator's peaks (equal to the plan's; kept to show the agreement)."""
    plan: Plan
    """The exact ledger of this configuration."""
    deepspeed_json: dict[str, Any]
    """The user's JSON with only the changed keys changed ("auto" kept where still right)."""
    script_diff: str
    """Unified diff of the training script (as memfit assumes it) to the recommended one."""
    scenario_inputs: ScenarioInputs
    """The scenario of this configuration (the patched JSON inline), for ``memfit plan``."""
    notes: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    """Paths written by ``write_recommendations``."""
    file_diffs: tuple[tuple[str, str], ...] = ()
    """(file name, unified diff against the user's file) for each of the user's files the
    configuration changes (``files.recommendation_files``), as ``--out`` writes them."""

    @property
    def gpu_peak_bytes(self) -> int:
        """The GPU requested peak (tensors + memory outside PyTorch), what the fast estimate gives."""
        return max(p.gpu_peak_bytes for p in self.plan.phases)

    @property
    def headline(self):
        """The plan's named figures (``memfit.core.figures``): the verdict's GPU and host figures."""
        from memfit.core.figures import headline

        return headline(self.plan)

    @property
    def node_cpu_peak_bytes(self) -> int:
        return max(p.node_cpu_peak_bytes for p in self.plan.phases)


@dataclass(frozen=True, slots=True, kw_only=True)
class RecommendResult:
    """What ``recommend`` found."""

    scenario_name: str
    hardware: Hardware
    headroom: float | None
    """The ``--headroom`` fraction given; None: the verdict's measured margins (``verdict.fit_limits``)."""
    gpu_limit_bytes: int
    """``(1 - headroom) x`` the GPU's capacity: a candidate's GPU peak must stay at or under it."""
    host_limit_bytes: int
    """``(1 - headroom) x`` the host RAM per node."""
    baseline: Plan
    """The user's own configuration, exact ledger."""
    baseline_fits_with_headroom: bool
    baseline_step_time: StepTime
    recommendations: tuple[Recommendation, ...]
    candidates_searched: int
    candidates_fitting: int
    search_seconds: float
    candidates_per_second: float
    max_fast_exact_diff_bytes: int
    """Largest |fast - exact| over the confirmed candidates, phases and peaks (GPU, host, node, NVMe)."""
    notes: tuple[str, ...] = ()
    headroom_words: str = ""
    """What the candidates were kept under, in words (``confirm.headroom_words``)."""
    user_inputs: ScenarioInputs | None = None
    """The user's inputs as given (their files not yet merged): ``files`` writes those files changed."""
    user_scenario: Any = None
    """The user's scenario as built (``Scenario``), for the script diff of ``recommend --out``."""
    base_candidate: Any = None
    """The user's configuration as a candidate of the search (a ``Candidate`` or ``TorchCandidate``)."""
    base_load_dtype: str | None = None
    """Outside DeepSpeed: the user's from_pretrained dtype (a candidate may change it with the precision)."""
    base_quantization: dict[str, Any] | None = None
    """Outside DeepSpeed: the user's bitsandbytes settings, as merged from their files."""
