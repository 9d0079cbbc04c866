"""The change to the user's training script, as a short unified diff.

memfit never sees the script, so it writes the few lines that matter as the scenario says they are
(how the model is loaded, whether zero.Init is on, checkpointing, the PEFT wrap, how DeepSpeed is
started) and diffs them against the same lines for the recommended configuration. A config with
``"auto"`` values is driven by transformers' Trainer (nothing else fills them), so the lines are
Trainer lines then: precision, micro-batch and accumulation are ``TrainingArguments``.

zero.Init needs ``HfDeepSpeedConfig`` alive *before* ``from_pretrained`` (transformers
``integrations/deepspeed.py``: ``is_deepspeed_zero3_enabled`` is read by ``from_pretrained``, which
then builds the model under ``deepspeed.zero.Init``).

The lines follow the library generation of the scenario's DeepSpeed version: for 0.19 (2025),
``from_pretrained(dtype=...)`` and ``transformers.integrations``; for 0.5/0.6 (early 2022, transformers
4.1x), ``torch_dtype=...`` and ``transformers.deepspeed``.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

from memfit.core.recommend.deepspeed.space import Candidate
from memfit.core.scenario.types import Scenario

_TORCH_DTYPES = {"fp16": "torch.float16", "bf16": "torch.bfloat16", "fp32": "torch.float32"}


def uses_trainer(raw: Mapping[str, Any]) -> bool:
    """Any ``"auto"`` in the config: only transformers' Trainer (or accelerate) fills those."""
    def walk(v: Any) -> bool:
        if isinstance(v, Mapping):
            return any(walk(x) for x in v.values())
        if isinstance(v, list):
            return any(walk(x) for x in v)
        return v == "auto"
    return walk(raw)


def _script(sc: Scenario, *, model_ref: str, ds_name: str, trainer: bool, zero_init: bool, load_dtype: str,
            low_cpu_mem_usage: bool, ckpt: bool, precision: str, micro: int, accum: int) -> list[str]:
    peft = sc.peft.method not in ("full", "freeze")
    current = sc.ds_version == "0.19"
    lines = ["import torch", "from transformers import AutoModelForCausalLM"
             + (", Trainer, TrainingArguments" if trainer else "")]
    if not trainer:
        lines.append("import deepspeed")
    if peft:
        lines.append("from peft import get_peft_model")
    if zero_init:
        lines.append(f"from transformers.{'integrations' if current else 'deepspeed'} import HfDeepSpeedConfig")
    lines += ["", f'ds_config = "{ds_name}"']
    if zero_init:
        lines.append("dschf = HfDeepSpeedConfig(ds_config)  # keep alive: from_pretrained then builds under zero.Init")
    kwargs = ""
    if load_dtype != "fp32":
        kwargs += f", {'dtype' if current else 'torch_dtype'}={_TORCH_DTYPES[load_dtype]}"
    if not low_cpu_mem_usage:
        kwargs += ", low_cpu_mem_usage=False"
    lines.append(f'model = AutoModelForCausalLM.from_pretrained("{model_ref}"{kwargs})')
    if ckpt and not trainer:
        lines.append("model.gradient_checkpointing_enable()")
    if peft:
        lines.append("model = get_peft_model(model, peft_config)")
    if trainer:
        args = [f"per_device_train_batch_size={micro}", f"gradient_accumulation_steps={accum}"]
        if precision != "fp32":
            args.append(f"{precision}=True")
        if ckpt:
            args.append("gradient_checkpointing=True")
        lines.append(f'args = TrainingArguments(output_dir="out", deepspeed=ds_config, {", ".join(args)})')
        lines.append("trainer = Trainer(model=model, args=args, train_dataset=train_dataset)")
    else:
        params = ("model.parameters()" if sc.train.model_parameters == "all"
                  else "[p for p in model.parameters() if p.requires_grad]")
        lines.append(f"engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters={params}, "
                     "config=ds_config)")
    return lines


def script_diff(sc: Scenario, raw: Mapping[str, Any], base: Candidate, cand: Candidate, *, model_ref: str,
                ds_name: str | None = None) -> str:
    """Unified diff from the script as the scenario describes it to the one ``cand`` needs (empty
    when the script does not change)."""
    trainer = uses_trainer(raw)
    name = ds_name or "ds_config.json"
    ref = PurePath(model_ref).name if "/" in model_ref and PurePath(model_ref).is_absolute() else model_ref
    common = {"model_ref": ref, "ds_name": name, "trainer": trainer}
    before = _script(sc, **common, zero_init=sc.load.zero_init, load_dtype=base.load_dtype,
                     low_cpu_mem_usage=base.low_cpu_mem_usage, ckpt=base.gradient_checkpointing,
                     precision=base.precision, micro=base.micro_batch, accum=base.grad_accum)
    after = _script(sc, **common, zero_init=cand.zero_init if cand.stage == 3 else sc.load.zero_init,
                    load_dtype=cand.load_dtype, low_cpu_mem_usage=cand.low_cpu_mem_usage,
                    ckpt=cand.gradient_checkpointing, precision=cand.precision, micro=cand.micro_batch,
                    accum=cand.grad_accum)
    if before == after:
        return ""
    return "\n".join(difflib.unified_diff(before, after, fromfile="train.py (as memfit assumes it)",
                                          tofile="train.py (recommended)", n=1, lineterm="")) + "\n"
