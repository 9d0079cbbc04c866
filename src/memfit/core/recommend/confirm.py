"""The limits a configuration must stay under with the user's headroom, and the check of a candidate
against them by the exact ledger (and of the fast estimate against the exact one), shared by the
DeepSpeed search (``search``) and the one for the other frameworks (``pytorch.search``).
"""

from __future__ import annotations

from memfit.core.hardware import Hardware
from memfit.core.ledger_types import Plan


def _limits(hw: Hardware, headroom: float | None) -> tuple[int, int, float]:
    """What a candidate may use: with ``headroom`` None, the card and the node's RAM (what the
    verdict calls "does not fit" beyond), the candidates then ranked by the verdict's level
    (``rank_by_level``: fits with memfit's measured margin before at risk); else ``(1 - headroom)`` of
    the GPU (per rank), of the host RAM and of the NVMe space (per node; unlimited when the scenario
    gives none)."""
    if headroom is None:
        return hw.gpu.total_bytes, hw.cpu_ram_bytes, float(hw.nvme_bytes) if hw.nvme_bytes is not None else float("inf")
    nvme = hw.nvme_bytes * (1 - headroom) if hw.nvme_bytes is not None else float("inf")
    return int(hw.gpu.total_bytes * (1 - headroom)), int(hw.cpu_ram_bytes * (1 - headroom)), nvme


def risk_ratio(gpu: int, node: int, hw: Hardware) -> float:
    """How far a configuration's GPU (per rank) and host (per node) figures go into the band the
    verdict calls "at risk": the larger of each over its "fits" limit (``verdict.fit_limits``); at
    most 1 means it fits with memfit's measured margin."""
    from memfit.core.verdict import fit_limits

    gl, hl = fit_limits(hw)
    return max(gpu / max(gl, 1), node / max(hl, 1))


def confirmation_order(found: list, hw: Hardware, peaks_of) -> list:  # noqa: ANN001
    """The order in which candidates (fastest first) are confirmed by the exact ledger when no
    ``--headroom`` is given: those the fast estimate puts within the verdict's "fits" limits, fastest
    first; then the others, least at risk first (``risk_ratio``)."""
    def ratio(item) -> float:  # noqa: ANN001
        peaks = peaks_of(item)
        return risk_ratio(max(p[0] for p in peaks), max(p[2] for p in peaks), hw)
    inside = [x for x in found if ratio(x) <= 1.0]
    return inside + sorted((x for x in found if ratio(x) > 1.0), key=ratio)


def rank_by_level(recs: list, top: int, hw: Hardware) -> tuple:
    """Confirmed recommendations (each with its exact ``plan``), ranked as the verdict judges them:
    those that fit with memfit's measured margin first, by step time (the order found), then those
    at risk, least at risk first; ``top`` kept and renumbered."""
    from dataclasses import replace

    from memfit.core.verdict import gpu_figure, host_figure

    def key(r) -> tuple:  # noqa: ANN001
        if r.plan.verdict.level == "fits":
            return (0, 0.0)
        return (1, risk_ratio(max(gpu_figure(p) for p in r.plan.phases), max(host_figure(p) for p in r.plan.phases), hw))
    order = sorted(recs, key=key)[:top]
    return tuple(replace(r, rank=i + 1) for i, r in enumerate(order))


def enough_fitting(recs: list, top: int) -> bool:
    """``top`` confirmed recommendations fit with the margin: no need to confirm more."""
    return sum(r.plan.verdict.level == "fits" for r in recs) >= top


def check_headroom(headroom: float | None) -> None:
    from memfit.errors import MemfitError

    if headroom is not None and not 0 <= headroom < 1:
        raise MemfitError(f"--headroom must be in [0, 1), got {headroom}")


def headroom_words(hw: Hardware, headroom: float | None) -> str:
    """The headroom a search kept, in words (the verdict's margins when none was given)."""
    if headroom is not None:
        return f"{headroom:.0%} headroom"
    from memfit.core.verdict import margins

    m = margins()
    return (f"no headroom, ranked by the verdict: those that fit with memfit's measured margins "
            f"({m['gpu']['margin']:.0%} GPU, {m['host']['margin']:.0%} host, and the OS reserve of the host's RAM) "
            "before those at risk")


def _fits(plan: Plan, hw: Hardware, headroom: float | None) -> bool:
    """The exact plan's verdict figures (OOM-relevant GPU bytes, page-locked host bytes) with headroom."""
    from memfit.core.verdict import gpu_figure, host_figure

    gpu_limit, host_limit, nvme_limit = _limits(hw, headroom)
    return all(gpu_figure(p) <= gpu_limit and host_figure(p) <= host_limit
               and p.nvme_bytes * hw.gpus_per_node <= nvme_limit for p in plan.phases)


def _fast_exact_diff(peaks, plan: Plan) -> int:
    """Largest |fast - exact| over the phases the fast estimate has: all but the epoch simulation's
    (the torch frameworks' lean timeline runs the same recipes), or also all but ``eval.*``
    (DeepSpeed's estimator does not have them)."""
    phases = [p for p in plan.phases if not p.name.startswith("epoch.")]  # the epoch runs after the ledger
    phases = phases if len(peaks) == len(phases) else [p for p in phases if not p.name.startswith("eval.")]
    return max(max(abs(g - p.gpu_peak_bytes), abs(h - p.cpu_peak_bytes), abs(node - p.node_cpu_peak_bytes),
                   abs(nv - p.nvme_bytes)) for (g, h, node, nv), p in zip(peaks, phases))


def rejection(plan: Plan, hw: Hardware, headroom: float | None, fast_exact_diff: int) -> str:
    """Why the exact ledger rejects a candidate the fast estimate accepted, as a short reason that
    the search's notes count: the fast estimate sums requested bytes, the verdict compares the
    allocator simulation's figures (``memfit.core.figures``), so a candidate can fit by the first
    and not by the second with no difference between the two ledgers' requested bytes."""
    from memfit.core.figures import GPU_OOM_RELEVANT, HOST_NODE
    from memfit.core.verdict import gpu_figure, host_figure

    gpu_limit, host_limit, _ = _limits(hw, headroom)
    for p in plan.phases:
        if gpu_figure(p) > gpu_limit:
            if fast_exact_diff == 0 and p.allocators_simulated:
                return (f"fit by requested bytes but not by the allocator simulation's {GPU_OOM_RELEVANT} "
                        f"(block rounding, cached segments, memory outside PyTorch)")
            return f"{GPU_OOM_RELEVANT} over the limit (fast estimate off by {fast_exact_diff:,} B)"
        if host_figure(p) > host_limit:
            if fast_exact_diff == 0 and p.allocators_simulated:
                return (f"fit by requested bytes but not by the pinned allocator simulation's {HOST_NODE} "
                        f"(power-of-two pinned blocks)")
            return f"{HOST_NODE} over the limit (fast estimate off by {fast_exact_diff:,} B)"
    return "NVMe over the limit"


def rejection_notes(reasons: list[str], hw: Hardware, headroom: float | None) -> list[str]:
    """One note per reason, with how many candidates it rejected."""
    from collections import Counter

    return [f"{n} candidate(s) the fast estimate accepted were skipped by the exact ledger ({headroom_words(hw, headroom)}): "
            f"{why}" for why, n in Counter(reasons).items()]
