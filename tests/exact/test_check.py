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
