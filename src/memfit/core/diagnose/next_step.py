"""How a diagnosis ends: the smallest change that fits, from ``memfit recommend`` on the user's own
scenario (the configuration with the fewest changes among those that fit every phase with the
headroom), with the figure it would have, by the name every output uses (``memfit.core.figures``)."""

from __future__ import annotations

from memfit.core.figures import VERDICT_TAG
from memfit.core.scenario.inputs import ScenarioInputs
from memfit.core.units import fmt_bytes
from memfit.errors import MemfitError

NO_SCENARIO = ("Plan this run to see which phase needs what and the smallest change that fits: `memfit diagnose "
               "SCENARIO.yaml --log LOG` (a scenario, or plan's flags: --model, --training-args, --deepspeed, --gpus "
               "...), then `memfit recommend` for the configurations that fit.")


def smallest_fit(inputs: ScenarioInputs, *, command: str, headroom: float = 0.1, plan_fits: bool = False) -> tuple[str, ...]:
    """Lines naming recommend's smallest fitting change for ``inputs`` (``command``: how the user
    runs recommend on the same inputs, e.g. ``memfit recommend run.yaml``). ``plan_fits``: the plan
    has the configuration fitting though the run failed; then the configuration recommend finds with
    the least GPU memory is named instead (the run needs more room than the plan gives it)."""
    from memfit.core.recommend import recommend

    try:
        result = recommend(inputs, top=5, headroom=headroom)
    except MemfitError as e:
        return (f"memfit recommend could not search this scenario: {e}",)
    changed = [r for r in result.recommendations if r.changes]
    if not changed:
        notes = "; ".join(result.notes) or "none of its configurations fits"
        return (f"memfit recommend found no change that fits with {headroom:.0%} headroom: {notes}",)
    from memfit.core.figures import headline

    hw = result.hardware
    if plan_fits:
        mine = headline(result.baseline).gpu
        best = min(changed, key=lambda r: (r.headline.gpu.bytes, len(r.changes)))
        if best.headline.gpu.bytes >= mine.bytes:
            return (f"The plan has this configuration fitting ({mine.name} {fmt_bytes(mine.bytes)} of "
                    f"{fmt_bytes(hw.gpu.total_bytes)}), and none of recommend's configurations needs less GPU memory: "
                    f"find what the run holds that the scenario does not (see the reconciliation) and plan again.",)
        h = best.headline
        what = "; ".join(f"{c.setting} {c.before} -> {c.after}" for c in best.changes)
        return (f"The plan has this configuration fitting, so the run holds more than the scenario describes (see the "
                f"reconciliation). The configuration recommend finds with the least GPU memory (#{best.rank}): {what}. "
                f"Its {h.gpu.name} ({VERDICT_TAG}) is {fmt_bytes(h.gpu.bytes)}, yours {fmt_bytes(mine.bytes)}, of "
                f"{fmt_bytes(hw.gpu.total_bytes)} per rank.",
                f"`{command} --out DIR` writes your files changed for it (with a diff of each) and a scenario that "
                f"`memfit plan` runs.")
    best = min(changed, key=lambda r: (len(r.changes), r.rank))
    h = best.headline
    what = "; ".join(f"{c.setting} {c.before} -> {c.after}" for c in best.changes)
    return (f"Smallest change that fits (recommend's #{best.rank}, {len(best.changes)} setting(s)): {what}. "
            f"Its {h.gpu.name} ({VERDICT_TAG}) is {fmt_bytes(h.gpu.bytes)} of {fmt_bytes(hw.gpu.total_bytes)} per "
            f"rank, {h.host.name} {fmt_bytes(h.host.bytes)} of {fmt_bytes(hw.cpu_ram_bytes)}.",
            f"`{command} --out DIR` writes your files changed for it (with a diff of each) and a scenario that "
            f"`memfit plan` runs; `{command}` alone lists all {len(result.recommendations)} configurations.")
