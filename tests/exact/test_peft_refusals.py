"""Adapter configs memfit reads against what peft 0.21.2 itself does with them.

Each ``adapter_config.json`` below is given to peft (``PeftConfig.from_pretrained`` then
``get_peft_model`` on a tiny GPT-2) and to memfit (``load_adapter_config`` then ``apply_peft`` on
the same model's shapes). Where peft fails, memfit must refuse the file with one line, never
swapping in a default; where peft builds the adapter, memfit must count the same trainable
parameters, except in the few cases listed in ``MEMFIT_STRICTER`` (each with its reason).
"""

from __future__ import annotations

import json
import logging
import warnings

import pytest

pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from memfit.core.catalog import ModelConfigSource  # noqa: E402
from memfit.core.peft.params import apply_peft  # noqa: E402
from memfit.core.peft.parse import load_adapter_config  # noqa: E402
from memfit.core.shapes import build_model_shape  # noqa: E402
from memfit.errors import MemfitError  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")

GPT2 = dict(model_type="gpt2", n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64, bos_token_id=0,
            eos_token_id=0)
L = {"peft_type": "LORA", "task_type": "CAUSAL_LM"}
P = {"peft_type": "PROMPT_TUNING", "task_type": "CAUSAL_LM", "num_virtual_tokens": 4}
X = {"peft_type": "PREFIX_TUNING", "task_type": "CAUSAL_LM", "num_virtual_tokens": 4}

CASES = {
    # the issue's four: peft takes the value as given and fails; memfit used to substitute a default
    "lora r null": {**L, "r": None},
    "lora r string": {**L, "r": "8"},
    "lora target_modules empty": {**L, "r": 8, "target_modules": []},
    "prompt num_virtual_tokens null": {**P, "num_virtual_tokens": None},
    "prefix num_virtual_tokens null": {**X, "num_virtual_tokens": None},
    # more of the same family
    "lora r float": {**L, "r": 8.0},
    "lora r true": {**L, "r": True},
    "lora r zero": {**L, "r": 0},
    "lora r negative": {**L, "r": -1},
    "lora alpha null": {**L, "lora_alpha": None},
    "lora alpha string": {**L, "lora_alpha": "16"},
    "lora alpha float": {**L, "lora_alpha": 16.5},
    "lora bias null": {**L, "bias": None},
    "lora bias unknown": {**L, "bias": "x"},
    "lora target_modules int": {**L, "target_modules": 5},
    "lora target_modules ints": {**L, "target_modules": [5]},
    "lora target_modules unmatched": {**L, "target_modules": ["nope"]},
    "lora use_dora null": {**L, "use_dora": None},
    "lora modules_to_save null": {**L, "modules_to_save": None},
    "lora task_type null": {**L, "task_type": None},
    "lora task_type unknown": {**L, "task_type": "BOGUS"},
    "lora defaults": dict(L),
    "prompt token_dim null": {**P, "token_dim": None},
    "prompt num_virtual_tokens string": {**P, "num_virtual_tokens": "4"},
    "prompt num_virtual_tokens negative": {**P, "num_virtual_tokens": -1},
    "prompt num_virtual_tokens zero": {**P, "num_virtual_tokens": 0},
    "prefix projection null": {**X, "prefix_projection": None},
    "prefix num_layers null": {**X, "num_layers": None},
    "prefix defaults": dict(X),
}

MEMFIT_STRICTER: dict[str, str] = {
    "prompt num_virtual_tokens zero": "peft builds an adapter with no trainable parameter; the run then fails in "
                                      "deepspeed.initialize (torch.optim: 'optimizer got an empty parameter list'), so "
                                      "memfit refuses it up front",
}
"""Cases where peft builds an adapter and memfit refuses it, each with its reason."""


def peft_trainable(config: dict, tmp_path) -> int | str:
    """Trainable parameters peft builds from ``config``, or the exception's name."""
    from peft import PeftConfig, get_peft_model

    (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    cfg = transformers.GPT2Config(**{k: v for k, v in GPT2.items() if k != "model_type"})
    transformers.logging.set_verbosity_error()
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = get_peft_model(transformers.GPT2LMHeadModel(cfg), PeftConfig.from_pretrained(str(tmp_path)))
    except Exception as e:  # noqa: BLE001 - whatever peft raises is the point
        return type(e).__name__
    finally:
        logging.disable(logging.NOTSET)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def memfit_trainable(config: dict, tmp_path) -> int | str:
    (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    base = build_model_shape(ModelConfigSource(name="tiny-gpt2", config=GPT2, path=None, origin="local"))
    try:
        return apply_peft(base, load_adapter_config(tmp_path / "adapter_config.json")).trainable_params
    except MemfitError as e:
        assert "\n" not in str(e)
        return "MemfitError"


@pytest.mark.parametrize("name", sorted(CASES))
def test_memfit_accepts_what_peft_builds_and_refuses_what_peft_refuses(name, tmp_path):
    config = CASES[name]
    theirs = peft_trainable(config, tmp_path)
    ours = memfit_trainable(config, tmp_path)
    if isinstance(theirs, str):
        assert ours == "MemfitError", f"peft raises {theirs}; memfit plans {ours} trainable params"
    elif name in MEMFIT_STRICTER:
        assert ours == "MemfitError"
    else:
        assert ours == theirs, f"peft builds {theirs} trainable params, memfit {ours}"


def test_the_issue_cases_are_refused_by_both(tmp_path):
    for name in ("lora r null", "lora r string", "lora target_modules empty", "prompt num_virtual_tokens null"):
        assert isinstance(peft_trainable(CASES[name], tmp_path), str), name
        assert memfit_trainable(CASES[name], tmp_path) == "MemfitError", name


def test_delora_under_zero3_zero_init_is_refused_in_one_line(tmp_path):
    """peft 0.21's DeLoRA takes each adapter's ``delora_w_norm`` as ``torch.norm(W.data, dim=0)`` when it
    builds the layer; under ZeRO-3's zero.Init ``W.data`` is DeepSpeed's empty placeholder (its own
    ``free_param``), so the norm is a 0-d zero and the adapter trains nothing. Both libraries are read
    here as they run; then memfit refuses exactly that combination, and plans the same files without
    zero.Init."""
    import inspect
    import subprocess
    import sys

    import peft
    import torch
    from deepspeed.runtime.zero import partition_parameters

    free_param = inspect.getsource(partition_parameters).split("def free_param(", 1)[1].split("\ndef ", 1)[0]
    assert "param.data = torch.empty(0, dtype=param.dtype, device=param.device)" in free_param
    cfg = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    for name, module in model.named_modules():
        if name.endswith("q_proj"):  # as free_param leaves a partitioned weight
            module.weight.data = torch.empty(0, dtype=module.weight.dtype, device=module.weight.device)
    built = peft.get_peft_model(model, peft.DeloraConfig(r=4, target_modules=["q_proj"]))
    norms = [b for n, b in built.named_buffers() if "delora_w_norm" in n]
    assert norms and all(b.shape == () and float(b) == 0.0 for b in norms)

    (tmp_path / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "DELORA", "task_type": "CAUSAL_LM", "r": 8, "target_modules": ["q_proj", "v_proj"]}))
    args = [sys.executable, "-m", "memfit.cli", "plan", "--model", "meta-llama/Llama-2-7b-hf", "--peft",
            str(tmp_path / "adapter_config.json"), "--deepspeed", "examples/deepspeed/llama3_70b_zero3_bf16.json",
            "--gpus", "2xa100-80gb"]
    refused = subprocess.run([*args, "--zero-init"], capture_output=True, text=True)
    assert refused.returncode == 2 and refused.stdout == ""
    line = refused.stderr.strip()
    assert "\n" not in line and "DeLoRA" in line and "zero.Init" in line and "tuners/delora/layer.py" in line
    assert subprocess.run([*args, "--no-zero-init"], capture_output=True, text=True).returncode == 0
