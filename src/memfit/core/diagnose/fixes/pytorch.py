"""The usual fixes of a memory failure outside DeepSpeed: a plain loop or the Trainer on one GPU,
DDP, FSDP1/FSDP2, and bitsandbytes QLoRA, named as the Trainer, accelerate and peft name them
(``per_device_train_batch_size``, ``gradient_checkpointing``, ``optim``, ``fsdp_offload_params``,
``fsdp_cpu_ram_efficient_loading``); nothing about ZeRO."""

from __future__ import annotations

from memfit.core.diagnose.fixes import RunFacts
from memfit.core.diagnose.results import EventKind, LogEvent


def fixes(ev: LogEvent, phase: str | None, f: RunFacts, *, host: bool, steady: bool) -> list[str]:
    fsdp = bool(f.framework and f.framework.startswith("fsdp"))
    out: list[str] = []
    ckpt = "" if f.checkpointing else "gradient_checkpointing=True, "
    if ev.kind == EventKind.PINNED_HOST_OOM:
        out.append("Page-locked host memory ran out: " + ("FSDP's CPU offload pins the sharded parameters and gradients "
                   "(fsdp_offload_params): run fewer ranks per node or add RAM; " if fsdp else "")
                   + "DataLoader(pin_memory=False) / dataloader_pin_memory=False.")
        return out
    if host:
        if phase in ("load", "setup", None):
            out.append("Every rank's from_pretrained builds the whole model in host RAM: load in bf16 "
                       "(torch_dtype=torch.bfloat16) with low_cpu_mem_usage=True"
                       + ("; with FSDP, fsdp_cpu_ram_efficient_loading: true loads it on rank 0 only" if fsdp else "")
                       + (" (a 4-bit base is quantized as it loads: low_cpu_mem_usage keeps one copy)" if f.quantized
                          else "") + ".")
        if fsdp and f.offload:
            out.append("FSDP CPU offload keeps the sharded parameters, gradients and optimizer states in host RAM: "
                       "fewer ranks per node, more RAM, or no offload (fsdp_offload_params: false) on larger GPUs.")
        out.append("DataLoader workers are forked copies of the process: fewer dataloader_num_workers.")
        return out
    if phase == "load":
        out.append("from_pretrained put the whole model on the GPU (device_map): load it in bf16"
                   + ("" if f.quantized else ", or quantize the base to 4 bits (QLoRA: BitsAndBytesConfig(load_in_4bit=True)"
                      " with a LoRA adapter)") + (", or shard it with FSDP" if not fsdp else "") + ".")
    elif phase == "setup":
        out.append(("FSDP wraps and moves its shards; each GPU holds 1/W of the model: more GPUs, fsdp_offload_params: "
                    "true, or a PEFT method" if fsdp else
                    "Moving the model and its optimizer to the GPU: every " + ("DDP rank holds the whole model, its "
                    "gradients and optimizer states: FSDP (FULL_SHARD) shards them" if f.framework == "ddp" else
                    "parameter, gradient and optimizer state is on this GPU: a PEFT method (LoRA), a 4-bit base (QLoRA) "
                    "or an 8-bit optimizer (optim=adamw_bnb_8bit)")) + ".")
    elif phase == "forward":
        out.append("Activations: a smaller per_device_train_batch_size with more gradient_accumulation_steps, " + ckpt
                   + "shorter max_length" + (", or pack shorter rows" if f.peft else "") + ".")
        if fsdp:
            out.append("FSDP all-gathers one wrap unit at a time: smaller units (fsdp_transformer_layer_cls_to_wrap: "
                       "the decoder layer), fsdp_activation_checkpointing: true, no forward prefetch.")
    elif phase == "backward":
        out.append("Gradients and activation gradients: " + ckpt + "a smaller per_device_train_batch_size"
                   + (", a smaller ddp_bucket_cap_mb" if f.framework == "ddp" else "")
                   + (" (FSDP reduce-scatters each unit's gradients as backward runs)" if fsdp else "") + ".")
    elif phase == "optimizer_step":
        out.append("Optimizer states" + (" (alive from the first step on)" if steady else " are created at the first "
                   "step") + ": an 8-bit or paged optimizer (optim=adamw_bnb_8bit or paged_adamw_8bit), optim=adafactor"
                   + (", or FSDP CPU offload (fsdp_offload_params: true)" if fsdp else
                      ", or FSDP to shard them across GPUs" if f.framework == "ddp" else "")
                   + ("" if f.peft else ", or train a LoRA adapter instead of every weight") + ".")
    elif phase == "save":
        out.append("Saving gathers the full state dict" + (": fsdp_state_dict_type: SHARDED_STATE_DICT saves shards" if fsdp
                   else ": save_pretrained(..., max_shard_size=...) or save only the adapter") + ".")
    return out
