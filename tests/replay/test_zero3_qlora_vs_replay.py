"""QLoRA under DeepSpeed ZeRO-3 against a CPU replay of the real libraries in a fake 2-rank world.

A tiny Llama is quantized by transformers' ``replace_with_bnb_linear`` with bitsandbytes' CPU backend
(NF4, double quantization, ``bnb_4bit_quant_storage`` bf16, as the PEFT docs' ZeRO-3 QLoRA recipe
sets it), LoRA r=8 on every Linear by peft, then ``deepspeed.initialize`` with ZeRO-3 (bf16, the CPU
accelerator, rank 0 of 2 on torch's fake process group) partitions it and runs one step. Read off
DeepSpeed's and bitsandbytes' objects and compared with memfit's plan of the same run:

- every frozen parameter's rank-0 partition (``param.ds_tensor``: the packed ``Params4bit`` storage
  split by ZeRO-3 like any frozen param) against ``zero3.param_partitions``: exact;
- the quantization state every rank keeps whole (``Params4bit.quant_state``: uint8 absmax, nested fp32
  absmax, offset, both codes; and the dynamic map ``functional.name2qmap`` caches once per device)
  against ``quant.state``: exact;
- the full packed size of each weight (what a ZeRO-3 gather brings back) against the plan's element
  counts.

Where the replay cannot follow the GPU run: ``from_pretrained`` under ``zero.Init`` with a quantization
config quantizes each weight as it loads; here the model is quantized first and partitioned by
``deepspeed.initialize`` (``zero_init`` false), the same partitions either way (ZeRO-3 sizes a param by
``ds_numel``, its storage's element count: partition_parameters.py ``_partition_param``).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("deepspeed")
pytest.importorskip("bitsandbytes")
pytest.importorskip("peft")

from memfit.core.catalog import ModelConfigSource  # noqa: E402
from memfit.core.dsconfig import parse_deepspeed_config  # noqa: E402
from memfit.core.frameworks.pytorch import QuantSettings  # noqa: E402
from memfit.core.hardware import GpuSpec, Hardware  # noqa: E402
from memfit.core.peft.params import apply_peft  # noqa: E402
from memfit.core.peft.spec import PeftSpec  # noqa: E402
from memfit.core.plan import make_plan  # noqa: E402
from memfit.core.scenario.types import LoadSettings, Scenario, TrainSettings  # noqa: E402
from memfit.core.shapes import build_model_shape  # noqa: E402

CONFIG = dict(model_type="llama", vocab_size=1000, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
              architectures=["LlamaForCausalLM"], bos_token_id=0, eos_token_id=0)
QUANT = QuantSettings(method="4bit", quant_type="nf4", double_quant=True, compute_dtype="bf16", quant_storage="bf16",
                      prepare_kbit=False)
DS = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 3},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
WORLD = 2

CHILD = r"""
import json, os, sys, warnings
warnings.filterwarnings("ignore")
os.environ.update(DS_ACCELERATOR="cpu", LOCAL_RANK="0", RANK="0", WORLD_SIZE="%(world)d", LOCAL_SIZE="1",
                  MASTER_ADDR="127.0.0.1", MASTER_PORT="29541")  # memfit.replay.child_common.launcher_env
import torch
from memfit.replay.fake_world import join_fake_world
join_fake_world(rank=0, world_size=%(world)d)
import deepspeed, peft
from memfit.core.frameworks.pytorch import QuantSettings
from memfit.replay.pytorch.quantize import build_quantized_model
q = QuantSettings(**json.loads(%(quant)r))
model = build_quantized_model(json.loads(%(config)r), load_dtype="bf16", quant=q, attention="sdpa", device="cpu")
model = peft.get_peft_model(model, peft.LoraConfig(task_type="CAUSAL_LM", r=8, lora_alpha=8, target_modules="all-linear"))
full = {n: p.numel() * p.element_size() for n, p in model.named_parameters()}
state = 0
for p in model.parameters():
    qs = getattr(p, "quant_state", None)
    if qs is not None:
        state += sum(t.numel() * t.element_size() for t in (qs.absmax, qs.code, qs.offset, qs.state2.absmax,
                                                                qs.state2.code))
import bitsandbytes.functional as F
state += sum(t.numel() * t.element_size() for t in F.name2qmap.values())  # the map quantize_4bit caches per device
engine, *_ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                  config=json.loads(%(ds)r))
parts = {n: p.ds_tensor.numel() * p.ds_tensor.element_size() for n, p in engine.module.named_parameters()
         if not p.requires_grad}  # the trained ones live in ZeRO-3's flat 16-bit buffer
ids = torch.zeros(1, 16, dtype=torch.long)
loss = engine(input_ids=ids, labels=ids).loss
engine.backward(loss)
engine.step()
print("MEASURED " + json.dumps({"full": full, "partitions": parts, "quant_state": state, "loss": float(loss)}))
"""


@pytest.fixture(scope="module")
def measured():
    import dataclasses

    code = CHILD % {"world": WORLD, "quant": json.dumps(dataclasses.asdict(QUANT)), "config": json.dumps(CONFIG),
                    "ds": json.dumps(DS)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("MEASURED "))
    return json.loads(line.removeprefix("MEASURED "))


def _plan():
    source = ModelConfigSource(name="tiny-llama", config=CONFIG, path=None, origin="local")
    model = apply_peft(build_model_shape(source), PeftSpec(method="lora", lora_r=8, target_modules_pattern="all-linear"))
    hw = Hardware(gpu=GpuSpec(name="cpu", total_bytes=2**40), gpus_per_node=WORLD, cpu_ram_bytes=2**42)
    sc = Scenario(name="tiny zero3 qlora", model_ref="tiny-llama", model=model, peft=PeftSpec(method="lora", lora_r=8,
                  target_modules_pattern="all-linear"), deepspeed=parse_deepspeed_config(DS), deepspeed_json=DS,
                  hardware=hw, load=LoadSettings(dtype="bf16", zero_init=False, from_checkpoint=False),
                  train=TrainSettings(seq_len=16, micro_batch=1, gradient_checkpointing=False),
                  ds_version="0.19", accelerator="cpu", framework="deepspeed", quant=QUANT)
    return sc, make_plan(sc)


def _item(plan, phase: str, key: str) -> int:
    ph = next(p for p in plan.phases if p.name == phase)
    return next(i.bytes for i in (*ph.items, *ph.resident) if i.key == key)


def test_frozen_partitions_equal_deepspeeds(measured):
    sc, plan = _plan()
    # read once every partition exists (inside initialize.partition the item grows param by param)
    assert _item(plan, "initialize.optimizer", "zero3.param_partitions") == sum(measured["partitions"].values())


def test_quantization_state_is_whole_on_every_rank(measured):
    sc, plan = _plan()
    assert _item(plan, "initialize.optimizer", "quant.state") == measured["quant_state"]


def test_packed_weights_are_sized_by_their_storage(measured):
    from memfit.core.ledger.context import RecipeContext

    ctx = RecipeContext.from_scenario(_plan()[0])
    assert {p.name: p.numel * (4 if p.adapter else ctx.model_bytes) for p in ctx.params} == measured["full"]
