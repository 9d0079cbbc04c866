"""X-LoRA through a whole scenario (``build_scenario`` from an adapter_config.json whose ``adapters`` name LoRA
experts saved by peft): the torch ledger's parameters against peft's own build in the same load dtype, dtype by
dtype. peft upcasts the 16-bit experts to fp32 (``autocast_adapter_dtype``) and builds the classifier in the base's
dtype (``XLoraClassifier``: ``.to(next(model.parameters()).dtype)``): ``TParam.dtype`` says the same. Then the plan
runs and says X-LoRA's note."""

from __future__ import annotations

import json
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

_DT = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _folder(tmp_path, cfg: dict) -> str:
    config = transformers.LlamaConfig(**cfg)
    for i, targets in enumerate((["q_proj", "v_proj"], ["q_proj", "down_proj"])):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config)
        peft.get_peft_model(model, peft.LoraConfig(task_type="CAUSAL_LM", r=4, target_modules=targets)
                            ).save_pretrained(str(tmp_path / f"e{i}"))
    peft.XLoraConfig(task_type="CAUSAL_LM", hidden_size=cfg["hidden_size"], xlora_depth=2, xlora_size=16,
                     adapters={"0": "e0", "1": "e1"}).save_pretrained(str(tmp_path / "xlora"))
    # the experts are named relative to the X-LoRA folder: move it beside them as a user would keep them
    (tmp_path / "xlora" / "e0").symlink_to(tmp_path / "e0")
    (tmp_path / "xlora" / "e1").symlink_to(tmp_path / "e1")
    return str(tmp_path / "xlora")


@pytest.mark.parametrize("load,precision", [("bf16", "bf16"), ("bf16", "amp_bf16"), ("fp32", "amp_bf16")])
def test_xlora_params_and_dtypes_equal_peft(load, precision, tmp_path, monkeypatch):
    from memfit.core.ledger.pytorch.params import build_torch_model
    from memfit.core.plan import make_plan
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.inputs import ScenarioInputs
    from memfit.replay.deepspeed.record_fixtures import TINY_LLAMA

    cfg = dict(TINY_LLAMA, num_hidden_layers=2, use_cache=False)
    adapter = _folder(tmp_path, {k: v for k, v in cfg.items() if k not in ("model_type", "architectures")})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    sc = build_scenario(ScenarioInputs(model=str(tmp_path / "config.json"), peft_method=adapter + "/adapter_config.json", load_dtype=load,
                                       precision=precision, accelerator="cpu"))
    ours = build_torch_model(sc).params
    monkeypatch.chdir(adapter)  # peft reads the relative expert folders from the working directory
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = transformers.LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("model_type", "architectures")})
        base = transformers.AutoModelForCausalLM.from_config(hf, dtype={"bf16": torch.bfloat16, "fp32": torch.float32}[load])
        real = peft.get_peft_model(base, peft.PeftConfig.from_pretrained(adapter))
    theirs = [(n, tuple(p.shape), p.requires_grad, _DT[p.dtype]) for n, p in real.named_parameters()]
    if precision == "bf16":  # pure bf16: what peft built is what trains
        assert [(p.name, p.shape, p.trainable, p.dtype) for p in ours] == theirs
    else:  # AMP: the Trainer trains what peft built; frozen params as loaded
        assert [(p.name, p.shape, p.trainable) for p in ours] == [t[:3] for t in theirs]
        built = {n: d for n, _, _, d in theirs}
        for p in ours:
            if "internal_xlora_classifier" in p.name or ".lora_" in p.name:
                assert p.dtype == built[p.name], p.name
    plan = make_plan(sc)
    assert any("XLORA: peft refuses a base whose config has use_cache true" in n for n in plan.notes)


def test_xlora_on_a_quantized_base_is_refused_in_one_line(tmp_path):
    """peft's X-LoRA swaps lora.Linear/Embedding/Conv2d only: an expert on a bitsandbytes layer is a
    ``lora.bnb.Linear4bit`` (not a ``lora.Linear``), checked here on peft's classes, so memfit refuses."""
    from peft.tuners import lora

    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.inputs import ScenarioInputs
    from memfit.errors import MemfitError
    from memfit.replay.deepspeed.record_fixtures import TINY_LLAMA

    bnb = pytest.importorskip("peft.tuners.lora.bnb")
    assert not issubclass(bnb.Linear4bit, lora.Linear) and not issubclass(bnb.Linear8bitLt, lora.Linear)
    cfg = dict(TINY_LLAMA, num_hidden_layers=2, use_cache=False)
    adapter = _folder(tmp_path, {k: v for k, v in cfg.items() if k not in ("model_type", "architectures")})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(MemfitError, match="X-LoRA on a bitsandbytes-quantized base is not modelled") as err:
        build_scenario(ScenarioInputs(model=str(tmp_path / "config.json"), peft_method=adapter + "/adapter_config.json",
                                      quantization={"method": "4bit"}, load_dtype="bf16", precision="amp_bf16",
                                      accelerator="cpu"))
    assert "\n" not in str(err.value)


def test_exact_build_sets_what_peft_requires_of_the_base(tmp_path):
    """``Tuner.model_config``: a base whose config caches (transformers' default) is built with ``use_cache``
    false, as the plan has it; peft itself raises on the cached one."""
    from memfit.core.peft.parse import load_adapter_config
    from memfit.exact.peft_build import build_peft_meta_model
    from memfit.replay.deepspeed.record_fixtures import TINY_LLAMA

    cfg = {k: v for k, v in dict(TINY_LLAMA, num_hidden_layers=2).items() if k not in ("model_type", "architectures")}
    adapter = _folder(tmp_path, {**cfg, "use_cache": False})
    spec = load_adapter_config(adapter)
    hf = transformers.LlamaConfig(**cfg, use_cache=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="use_cache"):
            peft.get_peft_model(transformers.AutoModelForCausalLM.from_config(hf),
                                peft.PeftConfig.from_pretrained(adapter, adapters=dict(spec.setting("adapters"))))
        built = build_peft_meta_model(transformers.AutoModelForCausalLM.from_config(hf), spec)
    assert built.base_model.lora_model.model.config.use_cache is False
