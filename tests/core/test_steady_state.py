"""The step phases beyond step 1 (issue #8 sections 1 and 4): later micro-steps of a gradient
accumulation (accum.*), the steady state (step2.*), the verdict over all of them, DeepSpeed 0.5's
per-backward reduce buffers, and --exact under ZeRO-3. Expected bytes are derived by hand from
DeepSpeed's code (cited per test), not from the ledger; the replays in
tests/fixtures/replay/*ga* check the same phases against real runs (test_plan_vs_replay.py).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import SEED, TODAY

from memfit.core.ledger.context import ceil_div
from memfit.core.ledger_types import Device, LedgerItem, TracedStep
from memfit.core.plan import make_plan
from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.inputs import ScenarioInputs
from memfit.core.scenario.read import read_scenario_file

N_PART_SEED = 478_287_872
"""The seed's prefix encoder, partitioned over 2 ranks (docs/deepspeed-allocations.md section 7)."""


def _items(plan, phase, device=None):
    return {i.key: i.bytes for i in plan.phase(phase).items if device is None or i.device is device}


def _ds(stage: int, ga: int, **zero) -> dict:
    return {"fp16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
            "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": ga,
            "zero_optimization": {"stage": stage, **zero}}


def _plan(stage: int, ga: int, model: str = "gpt2-medium", gpus: str = "2xa100-80gb", **zero):
    sc = build_scenario(ScenarioInputs(model=model, deepspeed_inline=_ds(stage, ga, **zero), gpus=gpus, seq_len=256))
    return sc, make_plan(sc)


def test_phases_in_run_order_accum_only_when_accumulating():
    _, one = _plan(2, 1)
    _, four = _plan(2, 4)
    base = ["load", "initialize.cast", "initialize.move", "initialize.partition", "initialize.optimizer",
            "forward", "backward"]
    tail = ["optimizer_step", "step2.forward", "step2.backward", "step2.optimizer_step", "save"]
    assert [p.name for p in one.phases] == base + tail
    assert [p.name for p in four.phases] == base + ["accum.forward", "accum.backward"] + tail


def test_steady_state_holds_the_states_created_at_the_first_step():
    """0.19: DeepSpeedCPUAdam creates exp_avg and exp_avg_sq at the first step (ops/adam/cpu_adam.py
    step: torch.zeros_like per fp32 sub group): 2 x 478,287,872 x 4 B, alive from then on, with the
    step's own memory. Not there in step 1's forward."""
    inputs = dataclasses.replace(read_scenario_file(SEED), **TODAY)
    plan = make_plan(build_scenario(inputs))
    states = 2 * N_PART_SEED * 4
    assert "optimizer.states" not in {i.key for i in plan.phase("forward").resident}
    step2 = {i.key: i.bytes for i in plan.phase("step2.forward").resident}
    assert step2["optimizer.states"] == states
    assert plan.phase("step2.forward").cpu_pageable_bytes >= plan.phase("forward").cpu_pageable_bytes + states


def _grads_in_partition_numel(sc, part: int) -> int:
    """stage_1_and_2.py 0.19.8 copy_grads_in_partition: ``grads_in_partition`` holds the whole of
    every param in ``params_in_partition``, which for rank 0 (get_partition_info) is every trained
    param starting before ``partition_size`` (all trained here: full fine-tuning, flat-buffer order)."""
    total = start = 0
    for p in sc.model.params:
        if start < part:
            total += p.numel
        start += p.numel
    return total


def _highest(sc, phase: str, key: str) -> int:
    """The bytes of ledger item ``key`` live after each event of ``phase``: their highest."""
    from memfit.core.ledger.build import build_timeline

    t = build_timeline(sc)
    names = [n for n, _ in t.phase_starts]
    i = names.index(phase)
    begin, end = t.phase_starts[i][1], t.phase_starts[i + 1][1]
    live = top = 0
    for k, (kind, name, _, n) in enumerate(t.events[:end]):
        if name == key:
            live += n if kind == "alloc" else -n
        if k + 1 >= begin:
            top = max(top, live)
    return top


def test_zero2_accumulation_keeps_a_partition_between_micro_steps():
    """stage_1_and_2.py 0.19.8: each backward copies this rank's gradients into grads_in_partition
    (copy_grads_in_partition, sum of the partition's params, fp16, allocated by the first call: when
    reduce_ipg_grads flushes a bucket holding one of the partition's params); the epilogue keeps it
    as all_grad_tensors (_release_ipg_buffers only drops the name), a later micro-step's own partition
    is added into it (accumulated_grad.add_) and dropped; the step frees it. With the default
    5e8-element bucket all of GPT-2 medium's gradients fit one bucket, flushed by the epilogue: the
    later micro-step's partition comes after the backward's peak (the activations still alive)."""
    sc, plan = _plan(2, 4)
    W = 2
    n = sum(p.numel for p in sc.model.params)
    part = ceil_div(n, 2 * W) * 2 * W // W  # flatten_dense_tensors_aligned to 2W, then 1/W
    gip = _grads_in_partition_numel(sc, part)
    assert gip > part  # GPT-2's param straddling rank 0's partition end counts whole
    assert "zero12.grads_in_partition" not in _items(plan, "forward")
    assert _items(plan, "accum.forward")["zero12.grads_in_partition"] == gip * 2
    bwd = _items(plan, "accum.backward")
    assert bwd["zero12.grads_in_partition"] == gip * 2  # the kept one; this micro-step's comes at the flush
    assert _highest(sc, "accum.backward", "zero12.grads_in_partition") == 2 * gip * 2  # both, at the epilogue
    assert bwd["zero12.reduce_buckets"] == 500_000_000 * 2  # setup_buckets: one bucket (overlap_comm off)
    assert "zero12.grads_in_partition" not in {i.key for i in plan.phase("optimizer_step").resident}


def test_zero1_accumulation_keeps_every_full_gradient():
    """ZeRO-1 reduces only at the boundary (reduce_ready_partitions_and_remove_grads): before it the
    full gradients accumulate in param.grad, fp16, for every trained param."""
    sc, plan = _plan(1, 2)
    n = sum(p.numel for p in sc.model.params)
    assert _items(plan, "accum.forward")["step.gradients"] == n * 2
    assert _items(plan, "step2.forward")["step.gradients"] == n * 2  # a later micro-step of step 2


def test_zero12_step_flattens_then_frees_the_gradients_before_the_states():
    """stage_1_and_2.py step (no offload): flatten(averaged_gradients) (part x 2 B), .to(fp32)
    (part x 4 B), the flat copy dropped, the kept gradients freed, then the optimizer creates its
    states (first step only): the first step peaks at states + fp32 copy, a later one at the
    kept gradients (grads_in_partition: the partition's params whole) + flat + fp32 copies."""
    sc, plan = _plan(2, 1)
    n = sum(p.numel for p in sc.model.params)
    part = ceil_div(n, 4) * 4 // 2
    gip = _grads_in_partition_numel(sc, part)
    before = {i.key: i.bytes for i in plan.phase("backward").resident if i.device is Device.GPU}
    assert before["zero12.grads_in_partition"] == gip * 2
    base = sum(v for k, v in before.items() if k != "zero12.grads_in_partition")
    states = part * 4 * 2
    assert plan.phase("optimizer_step").gpu_peak_bytes == base + states + part * 4
    after = {i.key: i.bytes for i in plan.phase("step2.backward").resident if i.device is Device.GPU}
    assert after["zero12.grads_in_partition"] == gip * 2 and after["optimizer.states"] == states
    assert plan.phase("step2.optimizer_step").gpu_peak_bytes == sum(after.values()) + part * 2 + part * 4


def test_verdict_is_the_worst_phase_including_the_steady_state():
    """A card between step 1's peak and the steady state's fails in a step2 phase."""
    sc, plan = _plan(2, 1)
    first = max(p.gpu_peak_bytes for p in plan.phases if not p.name.startswith("step2."))
    steady = max(p.gpu_peak_bytes for p in plan.phases if p.name.startswith("step2."))
    assert steady > first
    hw = dataclasses.replace(sc.hardware, gpu=dataclasses.replace(sc.hardware.gpu, total_bytes=(first + steady) // 2))
    plan2 = make_plan(dataclasses.replace(sc, hardware=hw))
    assert not plan2.verdict.fits
    assert plan2.verdict.failures[0].phase.startswith("step2.")


def test_deepspeed_05_allocates_two_reduce_buffers_at_every_backward():
    """0.5.10 stage3.py backward (lines 2929-2941): with contiguous_gradients, buf_0 of
    reduce_bucket_size elements, and buf_1 with overlap_comm (the seed's config has both), fp16;
    freed by _release_ipg_buffers. 2 x 500,000,000 x 2 B. 0.19 has none (one IPG bucket at init)."""
    for version, expected in (("0.5", 2 * 500_000_000 * 2), ("0.19", None)):
        plan = make_plan(build_scenario(dataclasses.replace(read_scenario_file(SEED), ds_version=version)))
        for phase in ("backward", "step2.backward"):
            assert _items(plan, phase).get("zero3.ipg_buffers_per_backward") == expected, (version, phase)


def test_deepspeed_05_keeps_grads_in_partition_when_accumulating_with_offload():
    """0.5.10 stage3.py partition_previous_reduced_grads: with the optimizer offloaded,
    grads_in_partition (sum of ds_numel of the optimizer's params, fp16) is allocated only when
    gradient_accumulation_steps > 1, on the host, pinned with offload_param pin_memory, and never
    freed (_release_ipg_buffers drops it only without offload)."""
    inputs = read_scenario_file(SEED)
    raw = json.loads((Path(SEED).parent / inputs.deepspeed).read_text())
    raw["gradient_accumulation_steps"] = 2
    raw["train_batch_size"] = 4
    for ga, expected in ((1, None), (2, N_PART_SEED * 2)):
        raw["gradient_accumulation_steps"] = ga
        raw["train_batch_size"] = 2 * ga
        sc = build_scenario(dataclasses.replace(inputs, ds_version="0.5", deepspeed=None, deepspeed_inline=raw))
        plan = make_plan(sc)
        got = {i.key: (i.bytes, i.device) for i in plan.phase("step2.forward").resident}.get("zero3.grads_in_partition")
        assert (got[0] if got else None) == expected
        if got:
            assert got[1] is Device.CPU_PINNED


def test_exact_zero3_has_no_zero12_buckets():
    """--exact under ZeRO-3: the traced step's items replace activations, gathered params and
    gradients; nothing of ZeRO-1/2 (setup_buckets, grads_in_partition) may appear."""
    sc = build_scenario(dataclasses.replace(read_scenario_file(SEED), **TODAY))
    act = LedgerItem(key="step.activations", name="a", device=Device.GPU, bytes=10**9, formula="f", source="s")
    traced = TracedStep(forward_items=(act,), backward_items=(act,), note="synthetic")
    plan = make_plan(sc, traced)
    for ph in plan.phases:
        assert not any(i.key.startswith("zero12.") for i in ph.items + ph.resident), ph.name
    assert _items(plan, "step2.forward")["step.activations"] == 10**9


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_every_step_phase_ends_where_the_next_starts(stage):
    """Nothing a micro-step allocates outlives it except what the code keeps: after the save, the
    GPU holds the model states and, under ZeRO-3, the persistent params."""
    _, plan = _plan(stage, 2)
    end = {i.key for i in plan.phase("save").resident if i.device is Device.GPU}
    transient = {"step.activations", "step.full_gradient", "zero3.gathered_params", "zero3.allgather_flat_buffer",
                 "zero12.reduce_buckets", "zero12.grads_in_partition", "step.gradients", "step.fp32_grad_tmp",
                 "step.flat_grad_tmp", "zero3.reduce_scatter_flat"}
    assert not end & transient, end & transient


def test_zero2_buffer_only_when_rank0_partition_gets_a_gradient():
    """DeepSpeed 0.6 with every param passed to the optimizer puts the frozen ones in ZeRO-2's flat
    buffer (``zero3.optimized_params``); rank 0's partition then holds only frozen params, so
    ``copy_grads_in_partition`` never runs there and ``grads_in_partition`` is never allocated
    (stage_1_and_2.py: it is created by the first copy). The fuzz test's seed 1362 crashed here."""
    from memfit.core.ledger.deepspeed.zero012 import grads_in_partition_numel
    from memfit.core.plan import make_plan
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.inputs import ScenarioInputs

    assert grads_in_partition_numel([4, 4, 4], 6) == 8
    assert grads_in_partition_numel([4, 4, 4], 6, [False, False, True]) == 0
    assert grads_in_partition_numel([4, 4, 4], 6, [False, True, True]) == 8
    sc = build_scenario(ScenarioInputs(
        model="gpt2", peft_method="prompt", peft_options={"num_virtual_tokens": 4}, model_parameters="all",
        deepspeed_inline={"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
                          "zero_optimization": {"stage": 2}, "fp16": {"enabled": True}},
        gpus="2xa100-80gb", seq_len=64, ds_version="0.6"))
    plan = make_plan(sc)
    assert not any(i.key == "zero12.grads_in_partition" for ph in plan.phases for i in ph.items)
