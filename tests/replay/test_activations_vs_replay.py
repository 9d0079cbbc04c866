"""Forward and backward of every replay fixture, checked against a CPU-kernel trace of the same step.

The replay runs DeepSpeed's CPU accelerator, so its activations are those of the CPU kernels.
``memfit.replay.activations.trace_replay_step`` traces the replay's own model and batch on fake
tensors with the CPU kernels (fake tensors equal real CPU tensors byte for byte,
tests/trace/test_tracker_vs_real.py, but for the kernel workspaces named below). Two checks per fixture, for step 1 (the plan's step):

1. The replay's host peak above what was live when the forward started, against the trace's
   activation-side bytes at its forward (and backward: plus the gradients autograd holds) peak.
   In the forward what is left is DeepSpeed's and the replay loop's scalar tensors
   (``TOL_SCALARS_BYTES``), and under ZeRO-3 with W >= 2 the parameters DeepSpeed has gathered at
   that moment, which must stay within the plan's own bound for them (largest module + prefetch,
   ``zero3.gathered_params``). The backward adds two things the trace cannot know: DeepSpeed's
   gradient buffers live at the activation peak (reduce buckets, the gradient partition, a full
   gradient before its reduce-scatter), and CPU kernel workspaces allocated outside tensors (bf16
   backward on an Intel Xeon with AMX: 58,656 B in every case here, whatever the model; none on the
   AMD EPYC the first fixtures were recorded on, where every ZeRO-2 residual was 32-40 B). Neither
   is modelled here: the residual must lie between 0 and the plan's own lines for the gradient
   buffers (``BACKWARD_BUFFERS``, 100-200 KB in these cases).
2. The plan with these traced activations (``cpu_traced_step``) against the replay's phase peak,
   for ZeRO-0/1/2 (whose plan holds the activations and nothing else new in the forward): within
   the initialize residual plus the scalars. In the backward the plan also holds the reduce
   buckets, the gradient partition and the largest full gradient at the activation peak, all of
   them, so it is above the replay by at most those lines.

Fixtures recorded before fp16 configs were always replayed as bf16 (``child.prepare_deepspeed_config``)
ran fp16 on CPUs with avx512_fp16, whose step allocates differently; they fail
test_fixtures.py's check that every fixture is current.
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
copy for ``float(loss)``, DeepSpeed's step counters): 24-40 B above the trace in the forward of
every fixture where nothing else differs, on both CPUs; 2x the worst."""
BACKWARD_BUFFERS = ("zero12.reduce_buckets", "zero12.grads_in_partition", "step.full_gradient", "step.gradients")
"""The plan's (analytic) backward lines for DeepSpeed's gradient buffers."""
TOL_INIT_BYTES = 162
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


def _plan_lines(sc, phase: str, keys) -> int:
    from memfit.core.plan import make_plan

    return sum(i.bytes for i in make_plan(sc).phase(phase).items if i.key in keys)


def _check_residual(m, sc, phase: str, residual: int) -> None:
    z3_world = sc.deepspeed.zero.stage == 3 and m.spec.world_size > 1
    bound = (_plan_lines(sc, "forward", ("zero3.gathered_params",)) if z3_world else 0) + TOL_SCALARS_BYTES
    if phase == "backward":
        bound += _plan_lines(sc, "backward", BACKWARD_BUFFERS)
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
    assert 0 <= rows["gptj_prefix_z3_offload_w1"] <= TOL_SCALARS_BYTES
    assert 0 <= rows["gptj_prefix_z2_w2"] <= TOL_SCALARS_BYTES
    assert rows["gptj_prefix_z3_offload_w2"] == rows["gptj_prefix_z3_offload_w4"] > 100 * TOL_SCALARS_BYTES


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
    buffers = sum(i.bytes for i in plan.phase("backward").items if i.key in BACKWARD_BUFFERS)
    assert buffers > 0
    assert -tol <= bwd.diff_bytes <= buffers + tol, \
        f"backward: plan {bwd.predicted_host_bytes:,} (of which {buffers:,} gradient buffers) vs {bwd.measured_host_bytes:,}"
