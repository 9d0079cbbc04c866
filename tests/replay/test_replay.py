"""Real replays (DeepSpeed 0.19.8 on its CPU accelerator, fake worlds of W ranks).

Every expected number is computed here from the real model (transformers + peft built on the meta
device from the same config), never from memfit's own formulas. Only cases with an offloaded
optimizer run here, so the one op to JIT-build is DeepSpeed's cpu_adam (minutes the first time;
the session fixture ``cpu_adam_built`` in conftest.py does it once, before any replay); the recorded
fixtures also cover the cases without offload.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from memfit.core.ledger_types import PHASES
from memfit.replay.deepspeed.record_fixtures import CASES
from memfit.replay.runner import run_replay

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("cpu_adam_built")]

TIMEOUT_S = 600
INIT = ("load", "initialize.cast", "initialize.move", "initialize.partition", "initialize.optimizer")


def reference_model(spec):
    """The model ``spec`` trains, built by transformers and peft directly (meta device)."""
    import peft
    import torch
    import transformers

    config = spec.effective_model_config()
    cls = getattr(transformers, config["architectures"][0])
    with torch.device("meta"):
        model = cls(transformers.AutoConfig.for_model(**config))
        p = spec.peft
        if p.method == "prefix":
            model = peft.get_peft_model(model, peft.PrefixTuningConfig(
                task_type="CAUSAL_LM", num_virtual_tokens=p.num_virtual_tokens,
                prefix_projection=p.prefix_projection, encoder_hidden_size=p.encoder_hidden_size))
        elif p.method == "lora":
            model = peft.get_peft_model(model, peft.LoraConfig(
                task_type="CAUSAL_LM", r=p.lora_r, lora_alpha=p.lora_alpha, target_modules=list(p.target_modules)))
    return model


def partition_numel(numel: int, world_size: int) -> int:
    """Elements of one rank's ZeRO-3 partition of a param: ceil(numel / W)."""
    return math.ceil(numel / world_size)


@pytest.fixture(scope="module")
def seed_like():
    return run_replay(CASES["gptj_prefix_z3_offload_w2"], timeout_s=TIMEOUT_S)


@pytest.fixture(scope="module")
def prefix_z3_w4():
    return run_replay(CASES["gptj_prefix_z3_offload_w4"], timeout_s=TIMEOUT_S)


@pytest.fixture(scope="module")
def lora_z3():
    return run_replay(CASES["llama_lora_z3_offload_w2"], timeout_s=TIMEOUT_S)


@pytest.fixture(scope="module")
def prefix_z2_offload():
    return run_replay(CASES["gptj_prefix_z2_offload_w2"], timeout_s=TIMEOUT_S)


def _ok(m):
    assert m.error is None, f"{m.error.kind} in {m.error.phase}: {m.error.message}\n{m.error.traceback}"
    return m


def test_every_phase_is_measured_in_run_order(seed_like):
    m = _ok(seed_like)
    names = [p.name for p in m.phases]
    steps = m.spec.steps
    assert names == [*INIT, *("forward", "backward", "optimizer_step") * steps, "save"]
    assert [PHASES.index(n) for n in names[:5]] == sorted(PHASES.index(n) for n in names[:5])
    for p in m.phases:
        assert p.completed and p.end_s >= p.start_s
        assert p.host_peak_bytes >= max(p.host_live_start_bytes, p.host_live_end_bytes)
        assert p.rss_peak_bytes >= p.rss_end_bytes > 0
    for earlier, later in zip(m.phases, m.phases[1:]):
        assert later.host_live_start_bytes == earlier.host_live_end_bytes


@pytest.mark.parametrize("case", ["seed_like", "prefix_z3_w4", "lora_z3"])
def test_zero3_partitions_read_off_deepspeed_are_ceil_numel_over_w(case, request):
    m = _ok(request.getfixturevalue(case))
    w = m.spec.world_size
    named = list(reference_model(m.spec).named_parameters())
    frozen = sum(partition_numel(p.numel(), w) * 2 for _, p in named if not p.requires_grad)
    trainable = sum(partition_numel(p.numel(), w) * 2 for _, p in named if p.requires_grad)
    items = m.items("initialize")
    assert items["zero3.ds_tensor.frozen"] == frozen
    assert items["zero3.ds_tensor.trainable"] == trainable
    assert items["zero3.fp16_partitioned_groups_flat"] == trainable
    assert items["zero3.fp32_partitioned_groups_flat"] == 2 * trainable  # fp32: 4 B per element
    step = m.items("step")
    assert step["optimizer.state.exp_avg"] == step["optimizer.state.exp_avg_sq"] == 2 * trainable


def test_load_peak_is_the_models_tensor_bytes(seed_like):
    """fp32 load: the host tracker's load peak is exactly the real model's params, buffers and
    peft's prompt_tokens (a plain tensor attribute of PeftModel)."""
    m = _ok(seed_like)
    assert m.spec.load_dtype == "fp32"
    ref = reference_model(m.spec)
    params = sum(p.numel() * 4 for p in ref.parameters())
    buffers = sum(b.numel() * b.element_size() for b in ref.buffers())
    prompt_tokens = sum(t.numel() * t.element_size() for t in ref.prompt_tokens.values())
    load = m.phase("load")
    assert load.host_peak_bytes - load.host_live_start_bytes == params + buffers + prompt_tokens
    assert load.host_live_end_bytes == load.host_peak_bytes
    assert m.model.param_bytes == params


def test_pinned_host_bytes_are_deepspeeds_pinned_buffers(seed_like):
    """The tracker's pinned bytes after initialize are exactly the buffers DeepSpeed pinned:
    every frozen partition, the flat 16-bit trainable partitions, the gradient partitions and
    the fp32 gradient buffers (offload_param and offload_optimizer with pin_memory)."""
    m = _ok(seed_like)
    items = m.items("initialize")
    pinned = (items["zero3.ds_tensor.frozen"] + items["zero3.param_groups_fp16_flat_cpu_memory"]
              + items["zero3.grad_partitions_flat_buffer"] + items["zero3.fp32_partitioned_groups_flat.grad"])
    assert m.phase("initialize.optimizer").host_pinned_end_bytes == pinned
    # Before the optimizer, every param's partition (frozen or not) was pinned.
    w = m.spec.world_size
    all_partitions = sum(partition_numel(p.numel(), w) * 2 for p in reference_model(m.spec).parameters())
    assert m.phase("initialize.partition").host_max_pinned_bytes == all_partitions


def test_zero2_flat_groups_and_master_partition(prefix_z2_offload):
    """ZeRO-2 keeps a full flat 16-bit copy of the trainable params, aligned to 2 x W elements
    (stage_1_and_2.py, flatten_dense_tensors_aligned with nccl_start_alignment_factor 2), and
    1/W of it as fp32 master weights."""
    m = _ok(prefix_z2_offload)
    w = m.spec.world_size
    trainable = sum(p.numel() for p in reference_model(m.spec).parameters() if p.requires_grad)
    flat = math.ceil(trainable / (2 * w)) * 2 * w
    items = m.items("initialize")
    assert items["zero12.bit16_groups_flat"] == flat * 2
    assert items["zero12.single_partition_of_fp32_groups"] == flat // w * 4
    assert m.items("step")["optimizer.state.total"] == 2 * (flat // w * 4)


def _failing(fault: str):
    base = CASES["llama_lora_z2_offload_w4"]
    return dataclasses.replace(base, name=f"fault-{fault}", steps=1, save="never", fault=fault)


@pytest.mark.parametrize(
    ("fault", "kind"),
    [("initialize.partition:raise", "error"), ("forward:oom", "host_oom"), ("backward:kill", "killed")],
)
def test_failures_are_captured_with_their_phase(fault, kind):
    phase = fault.split(":")[0]
    m = run_replay(_failing(fault), timeout_s=TIMEOUT_S)
    assert m.error is not None and (m.error.phase, m.error.kind) == (phase, kind), m.error
    assert m.phases[-1].name == phase or kind == "killed"
    finished = [p.name for p in m.phases if p.completed]
    assert finished == list(INIT + ("forward", "backward", "optimizer_step"))[: len(finished)]
    assert phase not in finished
    if kind != "killed":
        assert not m.phases[-1].completed and m.error.traceback
    if kind == "host_oom":
        assert "can't allocate memory" in m.error.message


HUNG_DEADLINE_MIN_S = 35
"""The deadline of the hung-child test, unless the machine is slower: see below."""
STARTUP_FACTOR = 4
"""The child must reach ``load`` before the deadline: it imports torch, DeepSpeed, transformers and
peft and loads cpu_adam. ``cpu_adam_built`` is the wall time of the first two and the load in a
fresh process (2-4 s here, idle); transformers, peft and the model build took at most 2x that in
every run seen, so 4x leaves a factor of 2."""


def test_a_hung_child_is_killed_at_the_deadline(cpu_adam_built):
    deadline = max(HUNG_DEADLINE_MIN_S, STARTUP_FACTOR * cpu_adam_built)
    m = run_replay(_failing("load:hang"), timeout_s=deadline)
    assert m.error is not None and (m.error.kind, m.error.phase) == ("timeout", "load"), m.error
    # SIGTERM unwinds the hang at once (the runner waits at most KILL_GRACE_S for the child and
    # KILL_GRACE_S for other process groups before its SIGKILL). No upper bound on the wall time: a
    # loaded machine stretches it; the error kind above says it was the deadline that stopped it.
    assert m.wall_s >= deadline  # time-ok: the supervisor waited at least its deadline (a lower bound a loaded machine cannot break)
