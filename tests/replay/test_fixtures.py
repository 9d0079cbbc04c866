"""The recorded replay fixtures (tests/fixtures/replay/*.json): complete, current and consistent.

Recorded by ``python -m memfit.replay.deepspeed.record_fixtures`` on DeepSpeed's CPU accelerator. The checks
without the slow mark read JSON only; the slow ones rebuild each case's model with transformers and
peft on the meta device and compare DeepSpeed's partition sizes with ceil(numel / W).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from memfit.core.ledger_types import PHASES
from memfit.replay.deepspeed import attribution
from memfit.replay.measurement import load_fixture
from memfit.replay.deepspeed.record_fixtures import CASES, SEED_FIXTURE, seed_case

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "replay"
INIT = ["load", "initialize.cast", "initialize.move", "initialize.partition", "initialize.optimizer"]


def _fixture(name):
    return load_fixture(str(FIXTURES / f"{name}.json"))


def test_every_case_has_a_fixture_and_every_fixture_a_case():
    assert sorted(p.stem for p in FIXTURES.glob("*.json")) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_is_current_complete_and_consistent(name):
    m = _fixture(name)
    assert m.spec == CASES[name], "case changed since recording: rerun record_fixtures --only " + name
    assert m.error is None
    assert m.versions["deepspeed"] == "0.19.8"
    if (m.spec.deepspeed_config.get("fp16") or {}).get("enabled"):  # every cpu replay of fp16 runs bf16
        assert "fp16" not in m.deepspeed_config_used and m.deepspeed_config_used["bf16"] == {"enabled": True}
    names = [p.name for p in m.phases]
    ga = m.deepspeed_config_used["gradient_accumulation_steps"]
    tail = ["save"] if "save" in names else []
    assert m.skipped_steps == 0 and len(m.losses) == m.spec.steps * ga and all(x is not None for x in m.losses)
    assert names == INIT + ["forward", "backward", "optimizer_step"] * (m.spec.steps * ga) + tail
    assert set(names) <= set(PHASES)
    for earlier, later in zip(m.phases, m.phases[1:]):
        assert later.host_live_start_bytes == earlier.host_live_end_bytes
        assert later.start_s >= earlier.start_s
    for p in m.phases:
        assert p.host_peak_bytes >= max(p.host_live_start_bytes, p.host_live_end_bytes)
        assert p.host_peak_bytes == p.host_peak_pinned_bytes + p.host_peak_pageable_bytes
    assert m.timeline and max(t.host_live_bytes for t in m.timeline) == max(p.host_peak_bytes for p in m.phases)
    for item in m.attributed:
        assert item.pinned_bytes is not None and 0 <= item.pinned_bytes <= item.bytes, item
        prefix = item.key.split(".")[0]
        documented = item.key.startswith("optimizer.state.") or f"``{item.key}``" in attribution.__doc__
        assert prefix in {"model", "load", "zero3", "zero12", "optimizer"} and documented, item.key


def test_the_seed_fixture_is_the_seed_case_recorded_today():
    root = Path(__file__).resolve().parents[2]
    m = load_fixture(str(root / SEED_FIXTURE))
    assert m.spec == seed_case(str(root)), "rerun python -m memfit.replay.deepspeed.record_fixtures --seed --overwrite"
    assert m.error is None and m.versions["deepspeed"] == "0.19.8"
    assert all(i.pinned_bytes is not None for i in m.attributed)


@pytest.mark.parametrize("name", sorted(n for n, s in CASES.items()
                                        if s.zero_stage == 3 and "offload_param" in s.deepspeed_config["zero_optimization"]))
def test_pinned_bytes_after_initialize_are_deepspeeds_pinned_buffers(name):
    m = _fixture(name)
    items = m.items("initialize")
    pinned = (items["zero3.ds_tensor.frozen"] + items["zero3.param_groups_fp16_flat_cpu_memory"]
              + items["zero3.grad_partitions_flat_buffer"] + items["zero3.fp32_partitioned_groups_flat.grad"])
    assert m.phase("initialize.optimizer").host_pinned_end_bytes == pinned


def _reference_named_params(spec):
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
    return list(model.named_parameters())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(n for n, s in CASES.items() if s.zero_stage == 3))
def test_zero3_fixture_partitions_are_ceil_numel_over_w(name):
    pytest.importorskip("peft")
    m = _fixture(name)
    w = m.spec.world_size
    named = _reference_named_params(m.spec)
    trainable = [p.numel() for _, p in named if p.requires_grad]
    frozen = [p.numel() for _, p in named if not p.requires_grad]
    # model_parameters="all" gives the same: ZeRO-3 drops requires_grad=False params from the
    # optimizer even when they are passed (stage3.py, _get_trainable_parameter_groups).
    items = m.items("initialize")
    assert items["zero3.ds_tensor.frozen"] == sum(math.ceil(n / w) * 2 for n in frozen)
    # Built after zero.Init, the PEFT modules are never cast: DeepSpeed skips
    # _cast_module_mixed_precision for a model that has any ds_id param, so they stay fp32.
    trainable_bytes = 4 if m.spec.zero_init else 2
    assert items["zero3.ds_tensor.trainable"] == sum(math.ceil(n / w) * trainable_bytes for n in trainable)
    assert items["zero3.fp32_partitioned_groups_flat"] == sum(math.ceil(n / w) * 4 for n in trainable)
    assert m.items("step")["optimizer.state.total"] == 2 * items["zero3.fp32_partitioned_groups_flat"]
    assert m.model.params == sum(frozen) + sum(trainable)
