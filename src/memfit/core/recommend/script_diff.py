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
                ds_name: str | None = None, new_ds_name: str | None = None) -> str:
    """Unified diff from the script as the scenario describes it to the one ``cand`` needs (empty
    when the script does not change). ``new_ds_name``: where the recommended DeepSpeed JSON is
    written (``recommend --out``), so the script opens that one."""
    trainer = uses_trainer(raw)
    name = ds_name or "ds_config.json"
    ref = PurePath(model_ref).name if "/" in model_ref and PurePath(model_ref).is_absolute() else model_ref
    common = {"model_ref": ref, "trainer": trainer}
    before = _script(sc, **common, ds_name=name, zero_init=sc.load.zero_init, load_dtype=base.load_dtype,
                     low_cpu_mem_usage=base.low_cpu_mem_usage, ckpt=base.gradient_checkpointing,
                     precision=base.precision, micro=base.micro_batch, accum=base.grad_accum)
    after = _script(sc, **common, ds_name=new_ds_name or name,
                    zero_init=cand.zero_init if cand.stage == 3 else sc.load.zero_init,
                    load_dtype=cand.load_dtype, low_cpu_mem_usage=cand.low_cpu_mem_usage,
                    ckpt=cand.gradient_checkpointing, precision=cand.precision, micro=cand.micro_batch,
                    accum=cand.grad_accum)
    if before == after:
        return ""
    return "\n".join(difflib.unified_diff(before, after, fromfile="train.py (as memfit assumes it)",
                                          tofile="train.py (recommended)", n=1, lineterm="")) + "\n"


# ------------------------------------------------------------------ outside DeepSpeed

_OPTIMIZERS = {
    "adamw_torch": "torch.optim.AdamW(params, lr=lr)",
    "adamw_torch_foreach": "torch.optim.AdamW(params, lr=lr, foreach=True)",
    "adamw_torch_single": "torch.optim.AdamW(params, lr=lr, foreach=False)",
    "adamw_torch_fused": "torch.optim.AdamW(params, lr=lr, fused=True)",
    "adamw_bnb_8bit": "bnb.optim.AdamW8bit(params, lr=lr)",
    "adamw_8bit": "bnb.optim.AdamW8bit(params, lr=lr)",
    "paged_adamw_8bit": "bnb.optim.PagedAdamW8bit(params, lr=lr)",
    "paged_adamw_32bit": "bnb.optim.PagedAdamW32bit(params, lr=lr)",
    "lion_32bit": "bnb.optim.Lion32bit(params, lr=lr)",
    "lion_8bit": "bnb.optim.Lion8bit(params, lr=lr)",
    "adafactor": "transformers.optimization.Adafactor(params, lr=lr, scale_parameter=False, relative_step=False)",
    "sgd": "torch.optim.SGD(params, lr=lr)",
    "adagrad": "torch.optim.Adagrad(params, lr=lr)",
}
"""A plain loop's optimizer for each Trainer ``optim`` string (transformers ``Trainer.get_optimizer_cls_and_kwargs``)."""


def _launch(framework: str, gpus: int, accelerate_config: str | None) -> str:
    if accelerate_config:
        return f"# launch: accelerate launch --config_file {accelerate_config} train.py"
    if framework == "torch":
        return "# launch: python train.py"
    return f"# launch: torchrun --nproc_per_node {gpus} train.py" + (
        "  (FSDP: the Trainer's fsdp argument, or fully_shard in the loop)" if framework.startswith("fsdp") else "")


def _torch_script(*, model_ref: str, peft: bool, trainer: bool, framework: str, gpus: int, precision: str,
                  optim: str, micro: int, accum: int, ckpt: bool, load_dtype: str, load_in_file: bool,
                  quant: dict | None, accelerate_config: str | None) -> list[str]:
    lines = [_launch(framework, gpus, accelerate_config)]
    kwargs = ""
    if load_dtype != "fp32" and not load_in_file:
        kwargs += f", dtype={_TORCH_DTYPES[load_dtype]}"
    if quant:
        q = [f"load_in_{quant.get('method', '4bit')}=True"]
        if quant.get("method") == "4bit":
            q += [f'bnb_4bit_quant_type="{quant.get("quant_type", "fp4")}"',
                  f"bnb_4bit_use_double_quant={bool(quant.get('double_quant', False))}",
                  f"bnb_4bit_compute_dtype={_TORCH_DTYPES[quant.get('compute_dtype', 'fp32')]}"]
            if quant.get("quant_storage", "uint8") != "uint8":
                q.append(f"bnb_4bit_quant_storage={_TORCH_DTYPES[quant['quant_storage']]}")
        lines.append(f"bnb_config = BitsAndBytesConfig({', '.join(q)})")
        kwargs += ", quantization_config=bnb_config"
    if not (trainer and load_in_file and not quant):
        lines.append(f'model = AutoModelForCausalLM.from_pretrained("{model_ref}"{kwargs})')
    if trainer:
        return lines  # the rest is the TrainingArguments file (its diff beside this one)
    if quant:
        lines.append("model = prepare_model_for_kbit_training(model)")
    if ckpt:
        lines.append("model.gradient_checkpointing_enable()")
    if peft:
        lines.append("model = get_peft_model(model, peft_config)")
    if precision in ("bf16", "fp16"):
        lines.append(f"model = model.to({_TORCH_DTYPES[precision]})  # pure {precision}: weights, gradients, states")
    lines.append(f"optimizer = {_OPTIMIZERS.get(optim, repr(optim))}")
    if precision == "amp_fp16":
        lines.append("scaler = torch.amp.GradScaler()")
    lines.append(f"for step, batch in enumerate(DataLoader(dataset, batch_size={micro})):")
    if precision in ("amp_bf16", "amp_fp16"):
        lines.append(f"    with torch.autocast(\"cuda\", dtype={_TORCH_DTYPES[precision[4:]]}):")
        lines.append(f"        loss = model(**batch).loss{f' / {accum}' if accum > 1 else ''}")
    else:
        lines.append(f"    loss = model(**batch).loss{f' / {accum}' if accum > 1 else ''}")
    lines.append("    scaler.scale(loss).backward()" if precision == "amp_fp16" else "    loss.backward()")
    step = "scaler.step(optimizer); scaler.update()" if precision == "amp_fp16" else "optimizer.step()"
    lines.append(f"    if (step + 1) % {accum} == 0:" if accum > 1 else "    if True:")
    lines.append(f"        {step}; optimizer.zero_grad()")
    return lines


def torch_script_diff(*, model_ref: str, peft: bool, trainer: bool, gpus: int, before: dict, after: dict) -> str:
    """Unified diff of the script lines a non-DeepSpeed configuration changes. ``before``/``after``:
    framework, precision, optim, micro, accum, ckpt, load_dtype, load_in_file, quant,
    accelerate_config (the accelerate config file it is launched with, or None). With the Trainer
    (a TrainingArguments file) only the launch and from_pretrained lines are the script's; the rest
    changes in the TrainingArguments, whose own diff is beside this one."""
    ref = PurePath(model_ref).name if "/" in model_ref and PurePath(model_ref).is_absolute() else model_ref
    common = {"model_ref": ref, "peft": peft, "trainer": trainer, "gpus": gpus}
    a, b = _torch_script(**common, **before), _torch_script(**common, **after)
    if a == b:
        return ""
    return "\n".join(difflib.unified_diff(a, b, fromfile="train.py (as memfit assumes it)",
                                          tofile="train.py (recommended)", n=1, lineterm="")) + "\n"
