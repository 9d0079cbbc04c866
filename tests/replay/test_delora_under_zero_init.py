"""DeLoRA on a model built under ZeRO-3's zero.Init (issue 21): peft's own build under DeepSpeed's own
zero.Init gives every adapter a zero weight norm, which is what memfit's one-line refusal of that combination
(``scenario/build.py``; the CLI side is tests/exact/test_peft_refusals.py) rests on. That test imitates
``free_param``; this one runs DeepSpeed's own zero.Init.

The build runs in a child process on DeepSpeed's CPU accelerator in a fake 2-rank world
(``memfit.replay.fake_world``): zero.Init partitions the tiny Llama's weights as it would on GPUs,
then ``peft.get_peft_model`` builds DeLoRA on q_proj. The control is the same build without zero.Init.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, os
os.environ.update(DS_ACCELERATOR="cpu", LOCAL_RANK="0", RANK="0", WORLD_SIZE="2")
import torch, transformers, peft, deepspeed
from memfit.replay.fake_world import join_fake_world
join_fake_world(rank=0, world_size=2)
cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                               num_attention_heads=4, num_key_value_heads=2)
out = {}
for zero_init in (True, False):
    ds = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}
    if zero_init:
        with deepspeed.zero.Init(config_dict_or_path=ds):
            model = transformers.LlamaForCausalLM(cfg)
    else:
        model = transformers.LlamaForCausalLM(cfg)
    model = peft.get_peft_model(model, peft.DeloraConfig(r=4, target_modules=["q_proj"]))
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    norm = layer.delora_w_norm["default"]
    out[str(zero_init)] = {"shape": list(norm.shape), "max": float(norm.abs().max()),
                           "weight": list(layer.get_base_layer().weight.shape)}
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def built():
    pytest.importorskip("deepspeed")
    pytest.importorskip("peft")
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29547"}
    import os

    env.update({k: v for k, v in os.environ.items() if k in ("HOME", "TMPDIR", "MEMFIT_CACHE_DIR")})
    # timeout: a hang guard, not a speed claim
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, (r.returncode, r.stderr[-1500:])
    return json.loads(line[len("RESULT "):])


def test_peft_under_zero_init_builds_a_zero_norm(built):
    assert built["True"] == {"shape": [], "max": 0.0, "weight": [0]}  # the placeholder, and the norm of it
    assert built["False"]["shape"] == [64] and built["False"]["max"] > 0  # the control: one norm per input


def _scenario(**extra):
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.inputs import ScenarioInputs

    kw = dict(model="meta-llama/Llama-2-7b-hf", peft_method="delora", peft_options={"target_modules": ["q_proj"]},
              framework="deepspeed", gpus="2xa100-80gb", seq_len=256, micro_batch=1,
              deepspeed_inline={"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                                "zero_optimization": {"stage": 3}})
    kw.update(extra)
    return build_scenario(ScenarioInputs(**kw))


def test_memfit_refuses_exactly_the_combination_that_builds_zero_norms(built):
    from memfit.errors import MemfitError

    assert built["True"]["max"] == 0.0  # the refusal rests on the build above
    with pytest.raises(MemfitError, match="zero.Init"):
        _scenario(zero_init=True)
    assert _scenario(zero_init=False).peft.method == "delora"
    assert _scenario(zero_init=True, peft_method="lora").peft.method == "lora"
