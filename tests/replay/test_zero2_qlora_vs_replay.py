"""QLoRA under DeepSpeed ZeRO-2 against a CPU replay of the real libraries in a fake 2-rank world.

As ``test_zero3_qlora_vs_replay`` with ``zero_optimization.stage`` 2: a tiny Llama quantized by
transformers' ``replace_with_bnb_linear`` with bitsandbytes' CPU backend (NF4, double quantization,
``bnb_4bit_quant_storage`` bf16), LoRA r=8 on every Linear by peft, ``deepspeed.initialize`` (bf16,
the CPU accelerator, rank 0 of 2 on torch's fake process group) and one step. Read off the objects
(``memfit.replay.deepspeed.attribution.read_items``, DeepSpeed 0.19.8's attribute names) and
compared with memfit's plan of the same run, byte for byte:

- the base as loaded (``Params4bit`` packed storage, norms, embeddings, head) and the fp32 adapters
  against ``load.weights`` and ``load.adapter_weights``; ZeRO-2 keeps the frozen base whole;
- the quantization state every rank keeps (absmax, nested absmax, offset, both codes, and the
  dynamic map ``functional.name2qmap`` caches once per device) against ``quant.state``;
- ZeRO-2's flat 16-bit copy of the adapters (``bit16_groups_flat``), the fp32 master partition
  (``single_partition_of_fp32_groups``), the gradient partition after backward
  (``averaged_gradients`` here) and Adam's states after the step against the plan's items.
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
DS = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 2},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
WORLD = 2

CHILD = r"""
import json, os, sys, warnings
warnings.filterwarnings("ignore")
os.environ.update(DS_ACCELERATOR="cpu", LOCAL_RANK="0", RANK="0", WORLD_SIZE="%(world)d", LOCAL_SIZE="1",
                  MASTER_ADDR="127.0.0.1", MASTER_PORT="29542")  # memfit.replay.child_common.launcher_env
import torch
from memfit.replay.fake_world import join_fake_world
join_fake_world(rank=0, world_size=%(world)d)
import deepspeed, peft
from memfit.core.frameworks.pytorch import QuantSettings
from memfit.replay.deepspeed.attribution import read_items
from memfit.replay.pytorch.quantize import build_quantized_model
q = QuantSettings(**json.loads(%(quant)r))
model = build_quantized_model(json.loads(%(config)r), load_dtype="bf16", quant=q, attention="sdpa", device="cpu")
model = peft.get_peft_model(model, peft.LoraConfig(task_type="CAUSAL_LM", r=8, lora_alpha=8, target_modules="all-linear"))
base = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)
adapters = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
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
items = {i.key: i.bytes for i in read_items(engine, at="initialize")}
ids = torch.zeros(1, 16, dtype=torch.long)
loss = engine(input_ids=ids, labels=ids).loss
engine.backward(loss)
items.update({"backward." + i.key: i.bytes for i in read_items(engine, at="backward")})
engine.step()
items.update({"step." + i.key: i.bytes for i in read_items(engine, at="step")})
print("MEASURED " + json.dumps({"base": base, "adapters": adapters, "quant_state": state, "items": items,
                                "loss": float(loss)}))
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


@pytest.fixture(scope="module")
def plan():
    source = ModelConfigSource(name="tiny-llama", config=CONFIG, path=None, origin="local")
    peft = PeftSpec(method="lora", lora_r=8, target_modules_pattern="all-linear")
    model = apply_peft(build_model_shape(source), peft)
    hw = Hardware(gpu=GpuSpec(name="cpu", total_bytes=2**40), gpus_per_node=WORLD, cpu_ram_bytes=2**42)
    sc = Scenario(name="tiny zero2 qlora", model_ref="tiny-llama", model=model, peft=peft,
                  deepspeed=parse_deepspeed_config(DS), deepspeed_json=DS, hardware=hw,
                  load=LoadSettings(dtype="bf16", zero_init=False, from_checkpoint=False),
                  train=TrainSettings(seq_len=16, micro_batch=1, gradient_checkpointing=False),
                  ds_version="0.19", accelerator="cpu", framework="deepspeed", quant=QUANT)
    return make_plan(sc)


def _item(plan, phase: str, key: str) -> int:
    ph = next(p for p in plan.phases if p.name == phase)
    return next(i.bytes for i in (*ph.items, *ph.resident) if i.key == key)


def test_base_and_adapters_as_loaded(measured, plan):
    assert _item(plan, "load", "load.weights") == measured["base"]
    assert _item(plan, "load", "load.adapter_weights") == measured["adapters"]


def test_quantization_state_is_whole_on_every_rank(measured, plan):
    assert _item(plan, "initialize.optimizer", "quant.state") == measured["quant_state"]


def test_zero2_buffers_equal_deepspeeds(measured, plan):
    got = measured["items"]
    assert _item(plan, "initialize.optimizer", "zero12.flat_16bit_params") == got["zero12.bit16_groups_flat"]
    assert _item(plan, "initialize.optimizer", "optimizer.fp32_master") == got["zero12.single_partition_of_fp32_groups"]
    assert _item(plan, "optimizer_step", "optimizer.states") == got["step.optimizer.state.total"]


def test_gradient_partition_after_backward(measured, plan):
    resident = next(p for p in plan.phases if p.name == "backward").resident
    # without contiguous gradients DeepSpeed keeps the partition as ``averaged_gradients`` (the plan's
    # one item for both: memfit.replay.deepspeed.compare ITEM_RULES); grads_in_partition stays unallocated
    got = measured["items"]
    assert got["backward.zero12.grads_in_partition"] + got["backward.zero12.averaged_gradients"] == \
        next(i.bytes for i in resident if i.key == "zero12.grads_in_partition")
