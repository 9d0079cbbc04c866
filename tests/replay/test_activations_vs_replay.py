"""Forward and backward of every replay fixture, checked against a CPU-kernel trace of the same step.

The replay runs DeepSpeed's CPU accelerator, so its activations are those of the CPU kernels.
``memfit.replay.activations.trace_replay_step`` traces the replay's own model and batch on fake
tensors with the CPU kernels (fake tensors equal real CPU tensors byte for byte,
tests/trace/test_tracker_vs_real.py, but for what is named below). Two checks per fixture, for step 1
(the plan's step):

1. The replay's host peak above what was live when the forward started, against the trace's
   activation-side bytes at its forward (and backward: plus the gradients autograd holds) peak. The
   residual is what the trace cannot see at the replay's peak:
   - DeepSpeed's own tensors. Bounded by the plan's lines for them at their highest over the phase
     (``_highest``: the sum of the lines live after each of the plan's events): ZeRO-3's gathered
     parameters (``GATHER_LINES``: the gathered params, the coalesced all-gather flat buffers, the
     persistent params' gathered copies) in the forward, those and the gradient buffers
     (``GRADIENT_LINES``) in the backward. Not the plan's lines at its own peak instant: the plan's
     activations are analytic (CUDA kernels) and its peak instant need not be the CPU replay's. Logged
     in a replay (coordinator hooks, module hooks): the loss runs after the LM head's forward
     post-hook has released its weight, and the loss's backward runs before the head's backward
     fetch, as the plan places them (step_activations.py); but under ZeRO-3 with W >= 2 the CPU replay
     peaks inside the head, while the plan's analytic peak is the loss. Forward, GPT-J (weight and
     bias in one coalesced gather): ``AllGatherCoalescedHandle.wait``'s ``torch.cat`` copies of the
     head's params while the flat buffer is still alive (partition_parameters.py 0.19.8; the seed
     replay: 528,611,328 + 528,482,304 + 129,024 = 1,057,222,656 B, its residual less the trace's
     loss transients); Llama (one param, its own buffer): the head's matmul with its weight gathered,
     26,000 B above the trace's loss peak. Backward: the head's matmul backward with its weight
     gathered (Llama LoRA: 256,000 B + the workspace below + 8 B).
   - CPU kernel workspaces allocated outside tensors (``CPU_BACKWARD_WORKSPACE_BYTES``): bf16
     backward on an Intel Xeon with AMX.
   - torch.utils.checkpoint's CPU RNG state per checkpointed block (``CHECKPOINT_RNG_BYTES``):
     ``torch.get_rng_state()`` is a real tensor even under FakeTensorMode, which the trace's tracker
     does not count.
   - a few scalar tensors (``TOL_SCALARS_BYTES``).
   The residual can be negative in the backward of full fine-tuning under ZeRO-2/3 only: the trace
   keeps every parameter's gradient (autograd's ``.grad``) where DeepSpeed has copied it into its
   buffers and freed it, so at the trace's peak the replay may hold up to the trace's gradient bytes
   less (stage_1_and_2.py / stage3.py ``reduce_independent_p_g_buckets_and_remove_grads``).
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

from memfit.core.ledger.deepspeed.step import OLD_GRADS_PART
from memfit.core.ledger.deepspeed.step_segments import (BUCKETS, FULL_GRAD, GRAD_COPY, GRAD_FP32, GRADS, GRADS_PART, OLD_IPG,
                                              RS_FLAT)
from memfit.core.ledger.deepspeed.zero3_fetch import AG_FLAT, AG_STAGING, GATHERED, PERSISTENT
from memfit.replay.measurement import load_fixture

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1] / "fixtures"
FIXTURES = sorted(glob.glob(str(ROOT / "replay" / "*.json"))) + sorted(glob.glob(str(ROOT / "replay_seed" / "*.json")))
IDS = [Path(p).stem for p in FIXTURES]

TOL_SCALARS_BYTES = 80
"""The replay's step holds a few 0-dim and 1-element tensors the trace does not (the loss's fp32
copy for ``float(loss)``, DeepSpeed's step counters): 24-40 B above the trace in the forward of
every fixture where nothing else differs, on both CPUs; 2x the worst."""
CPU_BACKWARD_WORKSPACE_BYTES = 58_656
"""Measured, not a tolerance: the bf16 backward's CPU kernel workspace on an Intel Xeon with AMX,
58,656 B in every fixture whatever the model (the ZeRO-2 residuals are this plus 0-8 B of scalars;
logged at the LM head's matmul backward); none on the AMD EPYC the first fixtures were recorded on."""
CHECKPOINT_RNG_BYTES = 5_056
"""``torch.get_rng_state()`` on CPU (torch 2.13: a 5,056-element uint8 tensor), saved by every
non-reentrant checkpointed call (torch/utils/checkpoint.py ``_checkpoint_without_reentrant_generator``,
``preserve_rng_state``) until its recompute: the gradient-checkpointing fixture's residual is
2 blocks x 5,056 = 10,112 B above its twin's, forward and backward."""
GATHER_LINES = (GATHERED, AG_FLAT, AG_STAGING, PERSISTENT)
"""The plan's (simulated) lines for ZeRO-3's gathered parameters."""
GRADIENT_LINES = (BUCKETS, GRADS_PART, FULL_GRAD, GRADS, RS_FLAT, GRAD_COPY, GRAD_FP32, OLD_IPG, OLD_GRADS_PART)
"""The plan's (analytic) lines for DeepSpeed's gradient buffers."""
BACKWARD_BUFFERS = (BUCKETS, GRADS_PART, FULL_GRAD, GRADS)
"""ZeRO-0/1/2's gradient buffers (check 2)."""
TOL_PLAN_TRACED_BYTES = 184
"""Check 2, the plan with the traced activations against the ZeRO-2 replays: what the plan leaves out
before the step (peft's prompt_tokens index, DeepSpeed's overflow flag: test_plan_vs_replay.TOL_INIT_BYTES)
and the step's scalars. Worst observed -92 B (GPT-J prefix, ZeRO-2, W = 2, forward; the others -4 to
-88 B); 2x that. In the backward the plan is above the replay by its gradient buffers less 58,664-58,724 B
(``CPU_BACKWARD_WORKSPACE_BYTES`` and scalars; 955,084 B with ZeRO-2's three accumulation steps)."""
KNOWN_GAPS: dict[tuple[str, str], str] = {}
"""Where DeepSpeed holds more than the ledger's bound: (fixture file stem, phase) -> why. Empty: the
seed replay's entry (residual 1,046,900,592 B against a bound of the gathered-params line alone,
528,482,384 B, read as "the embedding and the LM head both gathered") was the bound leaving out the
coalesced all-gather flat buffer and the bias's gathered copy; logged, the embedding is released
before the head is fetched. (It was keyed by the fixture's stem but looked up by the spec's name, a
sentence for the seed, so it never matched.) A new entry makes its case fail until the gap closes."""


@functools.cache
def _traced(path: str):
    pytest.importorskip("transformers")
    from memfit.replay.activations import trace_replay_step
    from memfit.replay.compare import scenario_of

    m = load_fixture(path)
    sc = scenario_of(m)
    return m, sc, trace_replay_step(sc, m.spec)


@functools.cache
def _timeline(path: str):
    from memfit.core.ledger.build import build_timeline

    return build_timeline(_traced(path)[1])


def _highest(path: str, phase: str, keys) -> int:
    """The plan's lines ``keys`` summed after each event of ``phase`` (and at its start): their highest."""
    t = _timeline(path)
    names = [n for n, _ in t.phase_starts]
    i = names.index(phase)
    begin = t.phase_starts[i][1]
    end = t.phase_starts[i + 1][1] if i + 1 < len(names) else len(t.events)
    live = top = 0
    for k, (kind, key, _, n) in enumerate(t.events[:end]):
        if key in keys:
            live += n if kind == "alloc" else -n
        if k + 1 >= begin:
            top = max(top, live)
    return top


def _check_residual(path: str, phase: str, residual: int, trace_gradient_bytes: int = 0) -> None:
    m, sc, _ = _traced(path)
    arch = sc.model.arch  # the replay's model: its layers override applied (replay.compare.scenario_of)
    rng = CHECKPOINT_RNG_BYTES * (arch.num_layers + arch.num_encoder_layers) if sc.train.gradient_checkpointing else 0
    bound = TOL_SCALARS_BYTES + rng
    if phase == "forward":
        bound += _highest(path, "forward", GATHER_LINES)
        low = 0
    else:
        bound += _highest(path, "backward", GATHER_LINES + GRADIENT_LINES) + CPU_BACKWARD_WORKSPACE_BYTES
        low = -trace_gradient_bytes if sc.deepspeed.zero.stage >= 2 else 0
    label = f"{phase}: replay - trace = {residual:+,} B (allowed {low:,}..{bound:,})"
    if (Path(path).stem, phase) in KNOWN_GAPS:  # the fixture's name, as IDS (a spec's name may be a sentence)
        assert residual > bound, f"known gap closed? {label}: remove it from KNOWN_GAPS"
        return
    assert low <= residual <= bound, label


@pytest.mark.parametrize("path", FIXTURES, ids=IDS)
def test_forward_activations_are_the_traced_cpu_kernels(path):
    m, _, tr = _traced(path)
    f = m.phase("forward", step=0, micro_step=0)
    residual = f.host_peak_bytes - f.host_live_start_bytes - tr.forward.breakdown.activation_side_bytes
    _check_residual(path, "forward", residual)


@pytest.mark.parametrize("path", FIXTURES, ids=IDS)
def test_backward_activations_and_grads_are_the_traced_cpu_kernels(path):
    m, _, tr = _traced(path)
    start = m.phase("forward", step=0, micro_step=0).host_live_start_bytes
    b = m.phase("backward", step=0, micro_step=0)
    traced = tr.backward.breakdown.activation_side_bytes + tr.backward.breakdown.gradient_bytes
    _check_residual(path, "backward", b.host_peak_bytes - start - traced, tr.backward.breakdown.gradient_bytes)


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
    tol = TOL_PLAN_TRACED_BYTES
    fwd = c.phase("forward")
    assert abs(fwd.diff_bytes) <= tol, f"forward: plan {fwd.predicted_host_bytes:,} vs {fwd.measured_host_bytes:,}"
    bwd = c.phase("backward")
    buffers = sum(i.bytes for i in plan.phase("backward").items if i.key in BACKWARD_BUFFERS)
    assert buffers > 0
    assert -tol <= bwd.diff_bytes <= buffers + tol, \
        f"backward: plan {bwd.predicted_host_bytes:,} (of which {buffers:,} gradient buffers) vs {bwd.measured_host_bytes:,}"
