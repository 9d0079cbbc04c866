"""Forward and backward of every replay fixture, checked to the byte against a CPU-kernel trace.

The replay runs DeepSpeed's CPU accelerator, so its activations are those of the CPU kernels.
``memfit.replay.activations.trace_replay_step`` traces the replay's own model and batch on fake
tensors with the CPU kernels (fake tensors equal real CPU tensors byte for byte:
tests/trace/test_tracker_vs_real.py). Two checks per fixture, for step 1 (the plan's step):

1. The replay's host peak above what was live when the forward started, against the trace's
   activation-side bytes at its forward (and backward: plus the gradients autograd holds) peak.
   What is left is DeepSpeed's and the replay loop's scalar tensors (``TOL_SCALARS_BYTES``), and
   under ZeRO-3 with W >= 2 the parameters DeepSpeed has gathered at that moment, which must stay
   within the plan's own bound for them (largest module + prefetch, ``zero3.gathered_params``).
2. The plan with these traced activations (``cpu_traced_step``) against the replay's phase peak,
   for ZeRO-0/1/2 (whose plan holds the activations and nothing else new in the forward): within
   the initialize residual plus the scalars. In the backward the plan also holds the reduce
   buckets, the gradient partition and the largest full gradient at the activation peak; in these
   replays DeepSpeed allocates them only after the activations peaked, so the plan is above the
   replay by exactly those lines, and the test says so to the byte (within the same tolerance).
"""

from __future__ import annotations

import functools
import glob
from pathlib import Path

import pytest

from memfit.replay.measurement import load_fixture

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1] / "fixtures"
FIXTURES = sorted(glob.glob(str(ROOT / "replay" / "*.json"))) + sorted(glob.glob(str(ROOT / "replay_seed" / "*.json")))
IDS = [Path(p).stem for p in FIXTURES]

TOL_SCALARS_BYTES = 80
"""The replay's step holds a few 0-dim and 1-element tensors the trace does not (the loss's fp32
copy for ``float(loss)``, DeepSpeed's loss-scale and step counters): 24-40 B above the trace in every
fixture where nothing else differs; 2x the worst."""
TOL_INIT_BYTES = 194
"""What the plan leaves out before the step (see test_plan_vs_replay.TOL_INIT_BYTES)."""
KNOWN_GAPS = {
    ("kogpt_prefix_zero3_offload_1layer_w2", "forward"): "the plan's bound on ZeRO-3's gathered params",
    ("kogpt_prefix_zero3_offload_1layer_w2", "backward"): "the plan's bound on ZeRO-3's gathered params",
}
"""Where DeepSpeed holds more gathered parameters than the ledger's bound (largest module +
prefetch): in the seed replay's step DeepSpeed has both 64,512 x 4,096 matrices (the embedding
and the untied LM head) gathered at the activation peak, about 1.05 GB against the bound's 0.56 GB.
Reported to the ledger's owner (the ZeRO-3 parameter coordinator); strict, so a fix shows."""


@functools.cache
def _traced(path: str):
    pytest.importorskip("transformers")
    from memfit.replay.activations import trace_replay_step
    from memfit.replay.compare import scenario_of

    m = load_fixture(path)
    sc = scenario_of(m)
    return m, sc, trace_replay_step(sc, m.spec)


def _gathered_bound(sc) -> int:
    """The plan's bound on ZeRO-3's gathered params (the analytic plan's ``zero3.gathered_params``)."""
    from memfit.core.plan import make_plan

    return next((i.bytes for i in make_plan(sc).phase("forward").items if i.key == "zero3.gathered_params"), 0)


def _check_residual(m, sc, phase: str, residual: int) -> None:
    z3_world = sc.deepspeed.zero.stage == 3 and m.spec.world_size > 1
    bound = (_gathered_bound(sc) if z3_world else 0) + TOL_SCALARS_BYTES
    label = f"{phase}: replay - trace = {residual:+,} B (allowed 0..{bound:,})"
    if (m.spec.name, phase) in KNOWN_GAPS:
        assert residual > bound, f"known gap closed? {label}: remove it from KNOWN_GAPS"
        return
    assert 0 <= residual <= bound, label


@pytest.mark.parametrize("path", FIXTURES, ids=IDS)
def test_forward_activations_are_the_traced_cpu_kernels(path):
    m, sc, tr = _traced(path)
    f = m.phase("forward", step=0, micro_step=0)
    residual = f.host_peak_bytes - f.host_live_start_bytes - tr.forward.breakdown.activation_side_bytes
    _check_residual(m, sc, "forward", residual)


@pytest.mark.parametrize("path", FIXTURES, ids=IDS)
def test_backward_activations_and_grads_are_the_traced_cpu_kernels(path):
    m, sc, tr = _traced(path)
    start = m.phase("forward", step=0, micro_step=0).host_live_start_bytes
    b = m.phase("backward", step=0, micro_step=0)
    traced = tr.backward.breakdown.activation_side_bytes + tr.backward.breakdown.gradient_bytes
    _check_residual(m, sc, "backward", b.host_peak_bytes - start - traced)


def test_gathers_are_what_differs_under_zero3():
    """The residual above is DeepSpeed's, not the trace's: with W = 1 (nothing to gather) and in
    ZeRO-2 it is the scalars alone; the GPT-J prefix case with W >= 2 gathers the same parameters
    at its peak whatever W is."""
    rows = {}
    for path in FIXTURES:
        m, sc, tr = _traced(path)
        f = m.phase("forward", step=0, micro_step=0)
        rows[m.spec.name] = f.host_peak_bytes - f.host_live_start_bytes - tr.forward.breakdown.activation_side_bytes
    assert rows["gptj_prefix_z3_offload_w1"] <= TOL_SCALARS_BYTES
    assert rows["gptj_prefix_z2_w2"] <= TOL_SCALARS_BYTES
    assert rows["gptj_prefix_z3_offload_w2"] == rows["gptj_prefix_z3_offload_w4"] > 100 * TOL_SCALARS_BYTES


BACKWARD_AFTER_PEAK = ("zero12.reduce_buckets", "zero12.grads_in_partition", "step.full_gradient")
"""Ledger lines of the backward that DeepSpeed allocates only after the activation peak here."""


@pytest.mark.parametrize("path", [p for p, i in zip(FIXTURES, IDS) if "_z2_" in i], ids=[i for i in IDS if "_z2_" in i])
def test_plan_with_traced_activations_matches_zero2_forward_and_backward(path):
    from memfit.core.plan import make_plan
    from memfit.replay.activations import cpu_traced_step
    from memfit.replay.compare import compare

    m, sc, tr = _traced(path)
    plan = make_plan(sc, cpu_traced_step(sc, tr))
    c = compare(plan, m, sc=sc)
    tol = TOL_INIT_BYTES + TOL_SCALARS_BYTES
    fwd = c.phase("forward")
    assert abs(fwd.diff_bytes) <= tol, f"forward: plan {fwd.predicted_host_bytes:,} vs {fwd.measured_host_bytes:,}"
    bwd = c.phase("backward")
    later = sum(i.bytes for i in plan.phase("backward").items if i.key in BACKWARD_AFTER_PEAK)
    assert later > 0
    assert abs(bwd.diff_bytes - later) <= tol, \
        f"backward: plan {bwd.predicted_host_bytes:,} - {later:,} (after the peak) vs {bwd.measured_host_bytes:,}"
