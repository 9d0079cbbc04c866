"""Ledger defects of issue #8 section 4, each against the DeepSpeed or transformers code it mirrors:
the ZeRO-1/2 flatten that falls back to host memory when the card cannot hold the flat copy next
to the model, and checkpoints loaded one shard at a time. (0.5.x's per-backward reduce buffers are
in test_steady_state.py.)"""

from __future__ import annotations

import dataclasses
import json

import pytest

from memfit.core.ledger.context import ceil_div
from memfit.core.ledger_types import Device
from memfit.core.plan import make_plan
from memfit.core.recommend.deepspeed.estimate import estimate_peaks
from memfit.core.recommend.deepspeed.search import prepare
from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.inputs import ScenarioInputs
from memfit.errors import MemfitError

ZERO2_OFFLOAD = {"fp16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
                 "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                 "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}


def _inputs(gpus: str, offload: bool = True) -> ScenarioInputs:
    ds = ZERO2_OFFLOAD if offload else {**ZERO2_OFFLOAD, "zero_optimization": {"stage": 2}}
    return ScenarioInputs(model="meta-llama/Llama-2-13b-hf", deepspeed_inline=ds, gpus=gpus,
                          cpu_ram="512GB", seq_len=512, load_dtype="fp16")


def _gpu_items(plan, phase):
    return {i.key: i.bytes for i in plan.phase(phase).items if i.device is Device.GPU}


def test_zero2_flattens_on_the_gpu_when_the_flat_copy_fits():
    """stage_1_and_2.py 0.19.8 lines 439-452: available_memory() >= flat_buffer_bytes: the flat copy
    is built on the card next to the moved model (2 x N x 2 B at the peak)."""
    sc = build_scenario(_inputs("1xa100-80gb"))
    plan = make_plan(sc)
    n = sum(p.numel for p in sc.model.params)
    S = ceil_div(n, 2) * 2  # one rank: aligned to 2W = 2
    items = _gpu_items(plan, "initialize.optimizer")
    assert items["zero12.flat_16bit_params"] == S * 2 and items["move.params"] == n * 2
    assert "zero12.flatten_on_cpu" not in {i.key for i in plan.phase("initialize.optimizer").items}


def test_zero2_flattens_in_host_memory_when_the_card_is_too_small():
    """Same lines: available_memory() < flat_buffer_bytes: every param copied to the host
    (param.data.cpu()), replaced by a 1-element fp32 tensor, the flat buffer built on the host
    (flatten_dense_tensors_aligned(use_cpu_data=True)), the copies deleted, the flat moved to the
    card. The card never holds the model and its flat copy together: the 13B model (26 GB in fp16)
    initializes on two 40 GB cards (the flat copy and this rank's half of it for the fp32 master,
    39.6 GB), where the on-card flatten needs 52 GB first."""
    # without optimizer offload the host peak of the phase is the flatten itself: its items show
    no_offload = make_plan(build_scenario(_inputs("2xa100-40gb", offload=False)))
    sc = build_scenario(_inputs("2xa100-40gb"))
    n = sum(p.numel for p in sc.model.params)
    S = ceil_div(n, 4) * 4
    host = {i.key: i.bytes for i in no_offload.phase("initialize.optimizer").items if i.device is Device.CPU_PAGEABLE}
    assert host["zero12.flatten_cpu_copies"] == n * 2 and host["zero12.flatten_on_cpu"] == S * 2
    plan = make_plan(sc)
    ph = plan.phase("initialize.optimizer")
    gpu = _gpu_items(plan, "initialize.optimizer")
    assert "move.params" not in gpu and gpu["zero12.flat_16bit_params"] == S * 2
    assert ph.gpu_peak_bytes < sc.hardware.gpu.total_bytes
    move = plan.phase("initialize.move").gpu_peak_bytes
    on_gpu = make_plan(dataclasses.replace(sc, hardware=build_scenario(_inputs("2xa100-80gb")).hardware))
    assert on_gpu.phase("initialize.optimizer").gpu_peak_bytes >= move + S * 2 > sc.hardware.gpu.total_bytes


@pytest.mark.parametrize("gpus", ["2xa100-40gb", "2xa100-80gb"])
def test_the_estimator_follows_both_flatten_paths(gpus):
    prep = prepare(_inputs(gpus))
    plan = make_plan(prep.scenario)
    for (g, h, node, nv), ph in zip(estimate_peaks(prep.aggregates, prep.base), plan.phases):
        assert (g, h, node, nv) == (ph.gpu_peak_bytes, ph.cpu_peak_bytes, ph.node_cpu_peak_bytes, ph.nvme_bytes), ph.name


# ---- checkpoints loaded one shard at a time --------------------------------------------------
LLAMA7_SHARDS = (9_976_545_280, 3_500_285_952)
"""Llama-2-7b-hf as saved by transformers 4.32 (default max_shard_size 10GB), fp16: the hub repo's
two files are 9,976,576,152 and 3,500,296,424 bytes: these parameters plus each file's safetensors
header (a few kB) and, in the first, the 32 rotary inv_freq buffers of 256 B older transformers
saved (30,872 and 10,472 B more)."""


def _llama7(**kw) -> ScenarioInputs:
    return ScenarioInputs(model="meta-llama/Llama-2-7b-hf", deepspeed_inline=ZERO3_OFFLOAD, gpus="2xa100-40gb",
                          cpu_ram="256GB", seq_len=512, **kw)


ZERO3_OFFLOAD = {"fp16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
                 "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                 "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                       "offload_param": {"device": "cpu"}}}


def test_default_shards_are_those_of_the_saving_transformers():
    """config.json says transformers 4.32 saved it: 10GB shards (checkpoint.DEFAULT_MAX_SHARD)."""
    layout = build_scenario(_llama7()).load.checkpoint
    assert layout.shard_bytes == LLAMA7_SHARDS and layout.saved_dtype == "float16"
    assert "10 GB" in layout.source and "4.32" in layout.source


def test_zero_init_load_holds_one_shard_not_the_file():
    """transformers from_pretrained under ZeRO-3 reads a shard's state dict, loads it module by
    module through GatheredParameters, drops it, then reads the next: the host holds the largest
    shard (9.98 GB), not the whole checkpoint (13.48 GB)."""
    plan = make_plan(build_scenario(_llama7(zero_init=True)))
    held = {i.key: i.bytes for i in plan.phase("load").items}
    assert held["load.checkpoint"] == max(LLAMA7_SHARDS)


def test_old_transformers_load_holds_the_model_and_one_shard():
    """low_cpu_mem_usage=False: a randomly initialised model plus the state dict of the shard being
    loaded (_load_state_dict_into_model per shard)."""
    sc = build_scenario(_llama7(low_cpu_mem_usage=False, transformers_version="4.40"))  # ignored from 4.51
    held = {i.key: i.bytes for i in make_plan(sc).phase("load").items}
    n_base = sum(p.numel for p in sc.model.params)
    assert held["load.weights"] == n_base * 4 and held["load.state_dict"] == max(LLAMA7_SHARDS)


def test_index_file_gives_the_shards(tmp_path):
    """A model.safetensors.index.json: its weight_map puts each tensor in a file; files load in
    sorted order; a tensor's bytes are its elements x the saved dtype (fp16 here)."""
    sc = build_scenario(_llama7())
    names = [k for shard in sc.load.checkpoint.shards for k, _ in shard]
    weight_map = {k: f"model-0000{1 + i % 3}-of-00003.safetensors" for i, k in enumerate(names)}
    weight_map["model.layers.0.self_attn.rotary_emb.inv_freq"] = "model-00001-of-00003.safetensors"
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    layout = build_scenario(_llama7(checkpoint_index=str(index))).load.checkpoint
    numel = {k: n for k, n in zip(names, (p.numel for p in sc.model.params))}
    expected = [sum(numel[k] * 2 for i, k in enumerate(names) if i % 3 == f) for f in range(3)]
    assert list(layout.shard_bytes) == expected and "model.safetensors.index.json" in layout.source
    plan = make_plan(build_scenario(_llama7(checkpoint_index=str(index), zero_init=True)))
    assert {i.key: i.bytes for i in plan.phase("load").items}["load.checkpoint"] == max(expected)


@pytest.mark.parametrize("content", ["not json", json.dumps({"weight_map": []}), json.dumps({"weight_map": {"x": "a"}})])
def test_bad_index_is_one_clear_error(tmp_path, content):
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(content)
    with pytest.raises(MemfitError) as e:
        build_scenario(_llama7(checkpoint_index=str(index)))
    assert "\n" not in str(e.value)


def test_the_estimator_follows_the_shards():
    for kw in ({"zero_init": True}, {"low_cpu_mem_usage": False, "transformers_version": "4.40"}):
        prep = prepare(_llama7(**kw))
        plan = make_plan(prep.scenario)
        for (g, h, node, nv), ph in zip(estimate_peaks(prep.aggregates, prep.base), plan.phases):
            assert (g, h, node, nv) == (ph.gpu_peak_bytes, ph.cpu_peak_bytes, ph.node_cpu_peak_bytes,
                                        ph.nvme_bytes), (kw, ph.name)
