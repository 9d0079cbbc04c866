"""The framework axis in the pure core: inputs, inference, contradictions, the phases of the torch
ledger and its arithmetic on known cases. (The recipes are checked against real runs in
tests/replay/test_torch_plan_vs_replay.py and tests/replay/test_optimizers_vs_torch.py.)"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time

import pytest

from memfit.core.frameworks.pytorch import TorchSettings
from memfit.core.ledger_types import TORCH_PHASES
from memfit.core.plan import make_plan
from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.inputs import ScenarioInputs
from memfit.core.scenario.read import read_scenario_file
from memfit.errors import MemfitError


def _plan(**kw):
    kw.setdefault("model", "gpt2")
    kw.setdefault("seq_len", 256)
    kw.setdefault("gpus", "1xa100-80gb")
    return make_plan(build_scenario(ScenarioInputs(**kw)))


def _resident(plan, phase, *keys):
    return sum(i.bytes for i in plan.phase(phase).resident if i.key in keys)


# ---- inference and contradictions ----------------------------------------------------------

def test_framework_is_inferred():
    assert build_scenario(ScenarioInputs(model="gpt2")).framework == "deepspeed"  # memfit's historical default
    assert build_scenario(ScenarioInputs(model="gpt2", precision="amp_bf16")).framework == "torch"
    assert build_scenario(ScenarioInputs(model="gpt2", optim="adafactor", gpus="2xa100-80gb")).framework == "ddp"
    assert build_scenario(ScenarioInputs(model="gpt2", fsdp={"sharding_strategy": "FULL_SHARD"},
                                         gpus="2xa100-80gb")).framework == "fsdp"
    assert build_scenario(ScenarioInputs(model="gpt2", quantization={"method": "4bit"},
                                         peft_method="lora")).framework == "torch"


@pytest.mark.parametrize("kw,match", [
    (dict(framework="fsdp", deepspeed_inline={"zero_optimization": {"stage": 2}}), "contradicts the DeepSpeed config"),
    (dict(precision="amp_bf16", deepspeed_inline={"zero_optimization": {"stage": 2}}), r"amp_\* are the torch"),
    (dict(framework="deepspeed", optim="adafactor"), "models a client torch AdamW only"),
    (dict(precision="amp_bf16", gpus="1xv100-32gb"), "v100"),
    (dict(framework="torch", gpus="2xa100-80gb"), "one GPU"),
    (dict(precision="amp_fp16", load_dtype="fp16"), "GradScaler"),
    (dict(quantization={"method": "4bit"}, peft_method="full"), "fully fine-tuned"),
    (dict(optim="adam_nonexistent", precision="fp32"), "invalid value 'adam_nonexistent'; valid: adamw_torch"),
    (dict(precision="fp8"), "invalid value 'fp8'; valid: fp32, amp_fp16, amp_bf16, fp16, bf16"),
    (dict(framework="jax"), "invalid value 'jax'; valid: deepspeed"),
    (dict(optim_args={"nesterov": True}, optim="sgd"), "unknown optim_args"),
    (dict(quantization={"method": "4bit", "bits": 3}), "unknown quantization"),
])
def test_contradictions_are_one_line_errors(kw, match):
    with pytest.raises(MemfitError, match=match):
        _plan(**kw)


def test_contradiction_exits_2_with_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "memfit.cli", "plan", "--model", "gpt2", "--precision", "bf16",
                        "--gpus", "1xv100-32gb"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "v100" in r.stderr, r.stderr


def test_yaml_keys(tmp_path):
    y = tmp_path / "s.yaml"
    y.write_text("model: gpt2\nframework: torch\nprecision: amp_fp16\noptim: sgd\noptim_args: {momentum: 0.9}\n"
                 "quantization: {method: none}\ntrain: {seq_len: 128, gradient_accumulation_steps: 4, max_grad_norm: 0}\n")
    sc = build_scenario(read_scenario_file(y))
    assert sc.framework == "torch"
    assert sc.torch == TorchSettings(precision="amp_fp16", optim="sgd", momentum=0.9, gradient_accumulation_steps=4,
                                     max_grad_norm=0.0)


# ---- phases ---------------------------------------------------------------------------------

def test_torch_phases_follow_contract_1():
    plan = _plan(precision="fp32")
    assert [p.name for p in plan.phases] == [p for p in TORCH_PHASES if not p.startswith(("accum", "eval."))]
    plan = _plan(precision="fp32", grad_accum=2)
    assert [p.name for p in plan.phases] == [p for p in TORCH_PHASES if not p.startswith("eval.")]


# ---- arithmetic on known cases ----------------------------------------------------------------

def test_pure_bf16_keeps_bf16_states_and_no_master():
    """Pure bf16 full fine-tuning with AdamW: params, grads and both states in bf16 (2 B each, 8 B per
    param), against fp32's 16 B per param; nothing else is model-state."""
    model = build_scenario(ScenarioInputs(model="gpt2")).model
    n, count = model.total_params, len(model.params)
    bf = _plan(precision="bf16", load_dtype="bf16", optim="adamw_torch_fused")
    fp = _plan(precision="fp32", optim="adamw_torch_fused")
    for plan, b in ((bf, 2), (fp, 4)):
        # exp_avg + exp_avg_sq in the param's dtype, + a 0-d fp32 step per param on the device (fused)
        assert _resident(plan, "optimizer_step", "optimizer.states") == 2 * n * b + 4 * count
        assert _resident(plan, "optimizer_step", "move.params") == n * b
        assert _resident(plan, "backward", "step.gradients") == n * b


def test_adamw_foreach_temporaries_are_the_larger_param_group():
    """Under foreach (CUDA's default) the step peak adds exp_avg_sq_sqrt of the Trainer's larger param group."""
    sc = build_scenario(ScenarioInputs(model="gpt2", precision="fp32", seq_len=128))
    plan = make_plan(sc)
    temps = max(i.bytes for i in plan.phase("step2.optimizer_step").items if i.key == "optimizer.step_temporaries")
    from memfit.core.ledger.pytorch.params import build_torch_model

    m = build_torch_model(sc)
    decay = sum(p.numel for p in m.params if p.trainable and p.decay) * 4
    nodecay = sum(p.numel for p in m.params if p.trainable and not p.decay) * 4
    assert temps == max(decay, nodecay)
    fused = make_plan(dataclasses.replace(sc, torch=dataclasses.replace(sc.torch, optim="adamw_torch_fused")))
    assert not any(i.key == "optimizer.step_temporaries" for i in fused.phase("step2.optimizer_step").items)


def test_eight_bit_and_paged_states():
    """adamw_bnb_8bit: 2 B per element of 8-bit states + fp32 absmax per 256 (params >= 4096
    elements; smaller ones keep 8 B fp32 states); paged: the big ones are counted on the host."""
    sc = build_scenario(ScenarioInputs(model="gpt2", optim="adamw_bnb_8bit", precision="fp32", seq_len=128))
    params = sc.model.params
    want = sum(2 * p.numel + 2 * 4 * -(-p.numel // 256) if p.numel >= 4096 else 8 * p.numel for p in params)
    assert _resident(make_plan(sc), "optimizer_step", "optimizer.states") == want
    paged = make_plan(dataclasses.replace(sc, torch=dataclasses.replace(sc.torch, optim="paged_adamw_8bit")))
    on_host = _resident(paged, "optimizer_step", "optimizer.paged_states")
    assert on_host == sum(2 * p.numel for p in params if p.numel >= 100_000)
    assert paged.phase("optimizer_step").gpu_peak_bytes < make_plan(sc).phase("optimizer_step").gpu_peak_bytes


def test_adafactor_factored_states():
    sc = build_scenario(ScenarioInputs(model="gpt2", optim="adafactor", precision="fp32", seq_len=128))
    want = sum(4 * (p.shape[0] + p.shape[1]) if len(p.shape) == 2 else 4 * p.numel for p in sc.model.params)
    want += 4 * len(sc.model.params)  # the 0-d RMS per param
    assert _resident(make_plan(sc), "optimizer_step", "optimizer.states") == want


def test_amp_casts_live_from_forward_to_backward():
    plan = _plan(precision="amp_bf16")
    fwd = {i.key: i.bytes for i in plan.phase("forward").items}
    assert fwd.get("amp.weight_casts", 0) > 0
    assert not any(i.key == "amp.weight_casts" for i in plan.phase("optimizer_step").resident)
    assert not any(i.key == "amp.weight_casts" for i in _plan(precision="fp32").phase("forward").items)


def test_plan_is_fast_and_imports_no_torch():
    code = ("import sys, time; from memfit.core.scenario.build import build_scenario; from memfit.core.scenario.inputs import ScenarioInputs; "
            "from memfit.core.plan import make_plan; "
            "f = lambda: make_plan(build_scenario(ScenarioInputs(model='meta-llama/Meta-Llama-3-8B', peft_method='lora', "
            "quantization={'method': '4bit', 'quant_type': 'nf4', 'double_quant': True, 'compute_dtype': 'bf16'}, "
            "precision='amp_bf16', load_dtype='bf16', gpus='1xrtx4090', gradient_checkpointing=True, grad_accum=4))); "
            "f(); t = time.perf_counter(); f(); print(time.perf_counter() - t); "
            "assert not any(m in sys.modules for m in ('torch', 'transformers', 'peft', 'bitsandbytes', 'deepspeed'))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    # the plan itself, once its modules are imported (about 0.14 s here, two thirds of it the allocator
    # simulation of 8,000 tensors), and `memfit plan`'s wall (< 0.5 s on an idle machine) are printed, not
    # asserted: a loaded machine stretches wall time (issue 24); benchmarks/bench_plan.py checks the target  # time-ok: a comment, it times nothing
    print(f"plan in process: {float(r.stdout.strip()):.3f} s")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "memfit.cli", "plan", "--model", "meta-llama/Meta-Llama-3-8B", "--peft",
                        "lora", "--quantization", "4bit", "--precision", "amp_bf16", "--load-dtype", "bf16", "--gpus",
                        "1xrtx4090", "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["scenario"]["framework"] == "torch"
    print(f"memfit plan wall: {time.perf_counter() - t0:.2f} s")


# ---- the allocator simulation on these ledgers ----------------------------------------------

def test_torch_ledgers_free_tensors_not_lumps_and_get_allocator_figures():
    """BRIEF contract 2 on a CUDA plan: every ``free`` of the torch, DDP and FSDP recipes is one live
    tensor (no granularity note from the timeline), over every framework, precision, optimizer, 4-bit
    base and checkpointing choice the search enumerates for three examples (a sample), and the
    allocator simulators' figures come out ordered as torch's counters are."""
    import random

    from memfit.core.frameworks.resolve import apply_input_files
    from memfit.core.recommend.pytorch.search import _base, candidate_inputs, enumerate_candidates

    root = "examples/frameworks/"
    checked = 0
    for name in ("adafactor-llama2-7b-1gpu.yaml", "ddp-lora-llama2-7b-2gpu.yaml", "fsdp2-offload-llama3-8b-8gpu.yaml"):
        inputs = apply_input_files(read_scenario_file(root + name))
        sc = build_scenario(inputs)
        base = _base(sc, inputs)
        cands = [c for c in enumerate_candidates(sc, base) if c.micro_batch == base.micro_batch]
        for c in random.Random(len(name)).sample(cands, min(25, len(cands))):
            try:
                csc = build_scenario(candidate_inputs(inputs, sc, c))
            except MemfitError:
                continue
            plan = make_plan(csc)
            assert not [n for n in plan.notes if "no single live tensor" in n], (name, c)
            for ph in plan.phases:
                assert ph.allocators_simulated
                assert ph.gpu_reserved_bytes >= ph.gpu_allocated_bytes >= ph.gpu_peak_bytes - ph.gpu_outside_pytorch_bytes
                assert ph.gpu_oom_relevant_bytes >= ph.gpu_allocated_bytes
            checked += 1
    assert checked >= 40
