"""Replay specs: the layer override keeps every shape (checked with the real transformers models),
JSON round trips, validation."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from memfit.core.peft.spec import PeftSpec
from memfit.errors import MemfitError
from memfit.replay.deepspeed.record_fixtures import CASES, TINY_GPTJ
from memfit.replay.spec import ReplaySpec, override_layers

CATALOG_MODELS = [
    "kakaobrain/kogpt",
    "gpt2",
    "meta-llama/Meta-Llama-3-8B",
    "mistralai/Mistral-7B-v0.1",
    "Qwen/Qwen2.5-7B",
    "facebook/opt-1.3b",
    "bigscience/bloom-7b1",
    "bigscience/T0_3B",
]


def _meta_model(config: dict):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.for_model(**config)
    cls = getattr(transformers, config["architectures"][0])
    with torch.device("meta"):
        return cls(cfg)


_INDEX = re.compile(r"\.(\d+)\.")


def _block_shapes(model) -> tuple[set[tuple[str, tuple[int, ...]]], set[int]]:
    """(name with indices replaced by *, shape) pairs, and the block indices seen (the first index in
    a name: ``transformer.h.0.``, ``encoder.block.0.layer.1.``)."""
    pairs, indices = set(), set()
    for name, p in model.named_parameters():
        found = _INDEX.search(name)
        if found:
            indices.add(int(found.group(1)))
        pairs.add((_INDEX.sub(".*.", name), tuple(p.shape)))
    return pairs, indices


@pytest.mark.slow
@pytest.mark.parametrize("ref", CATALOG_MODELS)
def test_layer_override_keeps_every_shape(ref):
    from memfit.core.catalog import resolve_model_config

    config = resolve_model_config(ref).config_dict()
    full_pairs, full_idx = _block_shapes(_meta_model(config))
    small = _meta_model(override_layers(config, 2))
    small_pairs, small_idx = _block_shapes(small)
    assert small_pairs == full_pairs
    assert small_idx == {0, 1}
    assert max(full_idx) > 1


def test_layer_override_leaves_the_input_alone():
    before = json.dumps(TINY_GPTJ, sort_keys=True)
    out = override_layers(TINY_GPTJ, 3)
    assert out["n_layer"] == 3 and json.dumps(TINY_GPTJ, sort_keys=True) == before


@pytest.mark.parametrize("bad", [0, -1, True, 2.5])
def test_layer_override_refuses_bad_counts(bad):
    with pytest.raises(MemfitError):
        override_layers(TINY_GPTJ, bad)


def test_spec_round_trips_through_json():
    for spec in CASES.values():
        again = ReplaySpec.from_json(spec.to_json())
        assert again == spec
        assert again.to_dict() == spec.to_dict()


@pytest.mark.parametrize(
    "change",
    [
        {"load_dtype": "fp8"},
        {"model_parameters": "some"},
        {"world_size": 0},
        {"rank": 2, "world_size": 2},
        {"accelerator": "tpu"},
        {"emulate_capacity_bytes": 10**9},  # needs cuda
        {"fault": "nowhere:raise"},
        {"fault": "load:explode"},
        {"deepspeed_config": {}},
        {"model_config": {"n_layer": 2}},
        {"zero_init": True, "deepspeed_config": {"zero_optimization": {"stage": 2}}},
    ],
)
def test_spec_refuses_bad_input_with_one_line(change):
    base = CASES["gptj_prefix_z3_offload_w2"].to_dict()
    base.update(change)
    with pytest.raises(MemfitError) as err:
        ReplaySpec.from_dict(base)
    assert "\n" not in str(err.value)


def test_spec_from_dict_refuses_unknown_fields():
    data = CASES["gptj_prefix_z3_offload_w2"].to_dict()
    data["layer"] = 3
    with pytest.raises(MemfitError, match="unknown fields layer"):
        ReplaySpec.from_dict(data)


def test_spec_from_scenario_carries_the_scenario_settings():
    from memfit.core.frameworks.deepspeed import DeepSpeedSettings, ZeroSettings
    from memfit.core.hardware import GPU_PRESETS, Hardware
    from memfit.core.model import ArchSpec, ModelShape
    from memfit.core.scenario.types import LoadSettings, Scenario, TrainSettings
    from memfit.replay.spec import spec_from_scenario

    shape = ModelShape(name="tiny", architecture="GPTJForCausalLM",
                       arch=ArchSpec(model_type="gptj", num_layers=28, hidden_size=128, num_heads=4, num_kv_heads=4,
                                     head_dim=32, intermediate_size=512, vocab_size=1000), params=())
    ds_json = CASES["gptj_prefix_z3_offload_w2"].deepspeed_config
    scenario = Scenario(
        name="seedlike", model_ref="tiny", model=shape, peft=PeftSpec(method="prefix", prefix_projection=True),
        deepspeed=DeepSpeedSettings(zero=ZeroSettings(stage=3)), deepspeed_json=ds_json,
        hardware=Hardware(gpu=GPU_PRESETS["rtx3090"], gpus_per_node=2),
        load=LoadSettings(dtype="fp32", zero_init=True),
        train=TrainSettings(seq_len=64, micro_batch=2, model_parameters="all", gradient_checkpointing=True),
    )
    spec = spec_from_scenario(scenario, model_config=TINY_GPTJ, layers=2, accelerator="cpu", threads=1)
    assert (spec.world_size, spec.seq_len, spec.micro_batch, spec.load_dtype) == (2, 64, 2, "fp32")
    assert spec.zero_init and spec.gradient_checkpointing and spec.model_parameters == "all"
    assert spec.peft == scenario.peft and spec.deepspeed_config == ds_json
    assert spec.effective_model_config()["n_layer"] == 2 and spec.threads == 1


def test_parent_side_imports_no_heavy_library():
    code = (
        "import sys, memfit.replay, memfit.replay.runner, memfit.replay.deepspeed.record_fixtures\n"
        "heavy = [m for m in ('torch', 'deepspeed', 'transformers', 'peft') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
