"""Merging the input files into ``ScenarioInputs``, with one-line errors for contradictions."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from memfit.core.inputs.common import Sourced
from memfit.errors import MemfitError


def merge_input_files(inputs):
    files = Sourced()
    if inputs.training_args:
        from memfit.core.inputs.training_args import read_training_args

        from memfit.core.stack.resolve import trainer_fsdp_version

        files.merge(read_training_args(inputs.training_args, fsdp_version_default=trainer_fsdp_version(inputs)))
    if inputs.accelerate_config:
        from memfit.core.inputs.accelerate_config import read_accelerate_config

        files.merge(read_accelerate_config(inputs.accelerate_config))
    if inputs.bnb_config:
        from memfit.core.inputs.bnb_config import read_bnb_config

        files.merge(read_bnb_config(inputs.bnb_config))
    v, origin = files.values, files.origin
    changes: dict[str, Any] = {}

    def take(field: str, key: str, value: Any = None, *, what: str | None = None) -> None:
        """The file's ``key`` fills ``field`` unless the scenario/flags set it; if they set it
        differently, that is a contradiction naming both."""
        if key not in v:
            return
        new = v[key] if value is None else value
        mine = getattr(inputs, field)
        if key in files.defaults and mine is not None:
            return  # the file does not say; the scenario's own value stands
        if mine is not None and mine != new and mine != {} and mine != ():
            raise MemfitError(f"{origin[key]} = {v[key]!r} contradicts {what or field} {mine!r} given in the scenario "
                              "or on the command line")
        changes[field] = new

    fw = v.get("framework") or inputs.framework
    if "framework" in v and inputs.framework is not None and inputs.framework != v["framework"]:
        raise MemfitError(f"{origin['framework']} means framework {v['framework']}, which contradicts framework "
                          f"{inputs.framework} given in the scenario or on the command line")
    if fw is None:  # no file names one: the Trainer/plain loop on the scenario's GPUs
        fw = None
    take("framework", "framework")
    take("micro_batch", "micro_batch")
    take("grad_accum", "grad_accum", what="gradient_accumulation_steps")
    take("gradient_checkpointing", "gradient_checkpointing")
    take("dataloader_pin_memory", "dataloader_pin_memory")
    take("optim", "optim")
    if "optim" in files.defaults and inputs.optim is None:  # the Trainer's default follows the stack
        from memfit.core.stack.resolve import trainer_optim_default

        changes["optim"], why = trainer_optim_default(inputs)
        files.notes.append(f"optim {changes['optim']}: {why}")
    take("optim_args", "optim_args")
    take("weight_decay", "weight_decay")
    take("max_grad_norm", "max_grad_norm")
    if inputs.lengths is not None:  # a length distribution: the file's length truncates, its packing batches
        take("max_seq_length", "seq_len", what="max_seq_length")
        take("batching", "batching")
    else:
        take("seq_len", "seq_len")
    take("load_dtype", "load_dtype", what="load dtype")
    for name in ("eval_strategy", "eval_batch", "eval_generate", "generation_max_length", "num_beams", "eval_steps",
                 "empty_cache_steps"):
        take(name, name)
    take("quantization", "quantization")
    if "deepspeed" in v:
        if inputs.deepspeed_inline is not None:
            raise MemfitError(f"{origin['deepspeed']} contradicts the inline DeepSpeed config of the scenario")
        take("deepspeed", "deepspeed")
    if "deepspeed_inline" in v:
        if inputs.deepspeed:
            raise MemfitError(f"{origin['deepspeed_inline']} contradicts the DeepSpeed config {inputs.deepspeed}")
        changes["deepspeed_inline"] = v["deepspeed_inline"]
    if "fsdp" in v:
        take("fsdp", "fsdp")
    if "gpus_count" in v:
        gpus = inputs.gpus
        if gpus:
            from memfit.core.hardware import parse_gpus

            count, _ = parse_gpus(gpus)
            if count != v["gpus_count"]:
                raise MemfitError(f"{origin['gpus_count']} = {v['gpus_count'] * v.get('nodes', 1)} processes on "
                                  f"{v.get('nodes', 1)} machine(s) contradicts gpus {gpus} given in the scenario or "
                                  "on the command line")
        else:
            raise MemfitError(f"{origin['gpus_count']}: say which GPUs they are with --gpus "
                              f"{v['gpus_count']}xNAME (e.g. {v['gpus_count']}xa100-80gb)")
    if "nodes" in v:
        take("nodes", "nodes")
    mp = v.get("mixed_precision")
    final_fw = changes.get("framework", inputs.framework)
    if mp is not None:
        if final_fw in ("fsdp", "fsdp2"):
            fs = dict(changes.get("fsdp", inputs.fsdp or {}))
            if mp in ("bf16", "fp16"):
                fs.setdefault("mixed_precision", mp)
            changes["fsdp"] = fs
            mp_prec = "fp32"  # sharded params fp32; FSDP computes in its param_dtype
        elif final_fw == "deepspeed":
            mp_prec = None  # DeepSpeed reads its own bf16/fp16 sections
        else:
            mp_prec = {"bf16": "amp_bf16", "fp16": "amp_fp16", "no": "fp32"}[mp]
        if mp_prec is not None:
            if inputs.precision is not None and inputs.precision != mp_prec:
                raise MemfitError(f"{origin['mixed_precision']} = {mp!r} contradicts precision {inputs.precision!r} "
                                  "given in the scenario or on the command line")
            changes["precision"] = mp_prec
    ddp = v.get("ddp_trainer")
    if ddp and final_fw in (None, "ddp", "torch"):
        merged = {**ddp, **(inputs.ddp or {})}
        changes["ddp"] = merged
    if ddp is not None and final_fw in (None, "ddp") and "find_unused_parameters" not in (ddp or {}):
        # the Trainer: find_unused_parameters = not gradient_checkpointing for a transformers model,
        # True for anything else (a PEFT model)
        peft = inputs.peft_method or "full"
        ckpt = changes.get("gradient_checkpointing", inputs.gradient_checkpointing) or False
        changes.setdefault("ddp", dict(inputs.ddp or {}))
        changes["ddp"]["find_unused_parameters"] = True if peft not in ("full", "freeze") else not ckpt
    if inputs.training_args and final_fw in ("fsdp", "fsdp2"):  # the Trainer's FSDP plugin for a PEFT model
        from memfit.core.stack.resolve import trainer_fsdp_wrap

        wrap = trainer_fsdp_wrap(inputs)
        if wrap is not None:
            changes["fsdp"] = {**dict(changes.get("fsdp", inputs.fsdp or {})), "wrap_policy": wrap[0]}
            files.notes.append(wrap[1])
    notes = tuple(files.notes)
    out = replace(inputs, training_args=None, accelerate_config=None, bnb_config=None, **changes)
    if notes:
        out = replace(out, input_notes=tuple(getattr(inputs, "input_notes", ())) + notes)
    return out
