"""memfit.check: the pre-flight check on a live (tiny, real) model, before deepspeed.initialize."""

import pytest

TINY = dict(vocab_size=1000, n_embd=128, n_layer=2, n_head=4, rotary_dim=16, n_positions=256)
DS = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
      "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                            "offload_param": {"device": "cpu", "pin_memory": True}},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}


@pytest.fixture(scope="module")
def prefix_model():
    import peft
    import transformers

    model = transformers.GPTJForCausalLM(transformers.GPTJConfig(**TINY))
    cfg = peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=8, prefix_projection=True,
                                  encoder_hidden_size=64)
    return peft.get_peft_model(model, cfg)


def test_check_reads_the_live_model(prefix_model):
    import memfit

    plan = memfit.check(prefix_model, DS, gpus="2x24GiB", cpu_ram="64GiB", seq_len=64, warn=False)
    real_total = sum(p.numel() for p in prefix_model.parameters())
    real_trained = sum(p.numel() for p in prefix_model.parameters() if p.requires_grad)
    assert (plan.params.total, plan.params.trainable) == (real_total, real_trained)
    assert plan.verdict.fits
    # the whole model moved to the GPU in bf16, as DeepSpeed will do with this (not zero.Init) model
    move = {i.key: i.bytes for i in plan.phase("initialize.move").items}
    assert move["move.params"] == real_total * 2


def test_check_raises_before_the_run_goes_out_of_memory(prefix_model):
    import memfit

    with pytest.raises(memfit.MemfitCheckError) as e:
        memfit.check(prefix_model, DS, gpus="2x256MiB", cpu_ram="64GiB", seq_len=64, warn=False)
    assert "will not fit" in str(e.value) and "GPU" in str(e.value)
    assert not e.value.plan.verdict.fits


def test_check_warns(prefix_model):
    import memfit

    with pytest.warns(memfit.MemfitWarning):
        memfit.check(prefix_model, DS, gpus="2x24GiB", cpu_ram="64GiB", seq_len=64)


def test_check_without_a_gpu_says_so(prefix_model):
    import torch

    import memfit
    from memfit.errors import MemfitError

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(MemfitError, match="no CUDA device"):
        memfit.check(prefix_model, DS)


def test_check_a_live_qlora_model_outside_deepspeed(tmp_path):
    """A tiny Llama quantized by bitsandbytes (NF4, double quant, bf16 compute) on this CPU, prepared
    for k-bit training and given LoRA: ``check(framework="torch")`` reads the quantization off its
    weights and the LoRA settings off its peft config, and plans exactly as the scenario written
    from the same config does, phase by phase and item by item."""
    import dataclasses
    import json

    torch = pytest.importorskip("torch")
    pytest.importorskip("bitsandbytes")
    from peft import prepare_model_for_kbit_training

    import memfit
    from memfit.core.frameworks.pytorch import QuantSettings
    from memfit.core.plan import make_plan
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.inputs import ScenarioInputs
    from memfit.replay.model_build import apply_peft
    from memfit.replay.pytorch.quantize import build_quantized_model
    from memfit.replay.deepspeed.record_fixtures import TINY_LLAMA

    q = QuantSettings(method="4bit", quant_type="nf4", double_quant=True, compute_dtype="bf16")
    cfg = dict(TINY_LLAMA, num_hidden_layers=2)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    sc = build_scenario(ScenarioInputs(model=str(tmp_path / "config.json"), peft_method="lora",
                                       peft_options={"lora_r": 4}, quantization=dataclasses.asdict(q),
                                       load_dtype="bf16", precision="amp_bf16", framework="torch",
                                       gpus="1x24GiB", cpu_ram="64GiB", seq_len=64, micro_batch=1))
    model = build_quantized_model(cfg, load_dtype="bf16", quant=q, attention="sdpa", device=torch.device("cpu"))
    model = apply_peft(prepare_model_for_kbit_training(model, use_gradient_checkpointing=False), sc.peft)

    plan = memfit.check(model, framework="torch", precision="amp_bf16", gpus="1x24GiB", cpu_ram="64GiB",
                        seq_len=64, micro_batch=1, warn=False)
    ref = make_plan(sc)
    assert [p.name for p in plan.phases] == [p.name for p in ref.phases]
    assert (plan.params.total, plan.params.trainable) == (ref.params.total, ref.params.trainable)
    for got, want in zip(plan.phases, ref.phases):
        assert {i.key: i.bytes for i in got.items} == {i.key: i.bytes for i in want.items}, got.name
        assert got.gpu_peak_bytes == want.gpu_peak_bytes, got.name


def test_check_ddp_and_fsdp2_without_a_deepspeed_config(prefix_model):
    import memfit
    from memfit.core.ledger_types import TORCH_PHASES
    from memfit.errors import MemfitError

    ddp = memfit.check(prefix_model, framework="ddp", precision="amp_bf16", gpus="2x24GiB", cpu_ram="64GiB",
                       seq_len=64, warn=False)
    assert [p.name for p in ddp.phases] == [p for p in TORCH_PHASES if not p.startswith(("accum.", "eval."))]
    assert any(i.key.startswith("ddp.bucket") for i in ddp.phase("backward").items)
    fsdp = memfit.check(prefix_model, framework="fsdp2", precision="bf16", gpus="2x24GiB", cpu_ram="64GiB",
                        seq_len=64, warn=False)
    assert fsdp.verdict.fits
    with pytest.raises(MemfitError, match="give the DeepSpeed config"):
        memfit.check(prefix_model, gpus="2x24GiB", cpu_ram="64GiB", warn=False)


def test_check_reads_a_live_lora_config_and_says_when_it_cannot():
    """A live LoraConfig keeps target_modules as a set (peft writes it as a list in
    adapter_config.json): its rank is read, not memfit's default; and layers_to_transform (planned
    since peft's generic tuner machinery) is read too: the plan's trainable params equal the live
    model's, with no fallback warning."""
    import peft
    import transformers

    import memfit

    def live(**lora):
        model = transformers.GPTJForCausalLM(transformers.GPTJConfig(**TINY))
        return peft.get_peft_model(model, peft.LoraConfig(task_type="CAUSAL_LM", r=4, target_modules=["q_proj"], **lora))

    def check(model):
        return memfit.check(model, framework="torch", precision="amp_bf16", gpus="1x24GiB", cpu_ram="64GiB",
                            seq_len=64, warn=False)

    import warnings

    model = live()
    assert isinstance(model.peft_config["default"].target_modules, set)
    with warnings.catch_warnings():
        warnings.simplefilter("error", memfit.MemfitWarning)  # read, no fallback to the defaults (r = 8)
        check(model)
    one_layer = live(layers_to_transform=[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", memfit.MemfitWarning)
        plan = check(one_layer)
    assert plan.params.trainable == sum(p.numel() for p in one_layer.parameters() if p.requires_grad)


def test_check_warns_when_the_run_is_at_risk(prefix_model):
    """A card whose capacity is above the plan's GPU peak but within memfit's measured margin of it
    (core/verdict_margin.json): the check passes, with an "at risk" warning naming the phase."""
    import math
    import warnings

    import memfit
    from memfit.core.verdict import gpu_figure, margins

    plan = memfit.check(prefix_model, DS, gpus="2x24GiB", cpu_ram="64GiB", seq_len=64, warn=False)
    peak = max(gpu_figure(p) for p in plan.phases)
    mib = math.ceil(peak * (1 + margins()["gpu"]["margin"] / 2) / 2**20)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        risky = memfit.check(prefix_model, DS, gpus=f"2x{mib}MiB", cpu_ram="64GiB", seq_len=64)
    assert risky.verdict.level == "at_risk" and risky.verdict.fits
    assert any("at risk" in str(w.message) for w in seen if issubclass(w.category, memfit.MemfitWarning))
