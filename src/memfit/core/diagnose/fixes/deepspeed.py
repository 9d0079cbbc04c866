"""The usual fixes of a memory failure under DeepSpeed, by phase and ZeRO stage: zero.Init and the
ZeRO-3 limits are offered under ZeRO-3 only, a higher stage below it (the phases as the replay's
seams draw them: memfit/replay/deepspeed/seams.py)."""

from __future__ import annotations

from memfit.core.diagnose.fixes import RunFacts
from memfit.core.diagnose.results import EventKind, LogEvent

ZERO_INIT = ("build the model under deepspeed.zero.Init (with transformers: create HfDeepSpeedConfig(ds_config) "
             "before from_pretrained, or use the Trainer with --deepspeed) so each rank only ever holds its partition")


def fixes(ev: LogEvent, phase: str | None, f: RunFacts, *, host: bool, steady: bool) -> list[str]:
    stage = f.zero_stage
    z3 = stage == 3
    below3 = stage is not None and stage < 3
    out: list[str] = []
    if ev.kind == EventKind.PINNED_HOST_OOM:
        out.append("Set \"pin_memory\": false under offload_param and offload_optimizer (slower host-device copies; "
                   "DeepSpeed 0.19.8 still pins its flat 16-bit buffer), or run fewer ranks per node.")
        out.append("Leave more RAM to pin: load in fp16/bf16 (torch_dtype)" + (f" and {ZERO_INIT}" if z3 else "") + ".")
        return out
    if host:
        if phase in ("load", "initialize.cast", None):
            out.append("Every rank's from_pretrained builds the whole model in host RAM (fp32 unless told otherwise): load "
                       "in fp16/bf16 (torch_dtype=...) with low_cpu_mem_usage=True"
                       + (f", and {ZERO_INIT}." if z3 else
                          "; ZeRO-3 with zero.Init would hold only a partition per rank." if below3 else "."))
        if f.offload or phase not in ("load",):
            out.append("Less offload memory per node: pin_memory false, offload to NVMe (ZeRO-3), fewer ranks per node; "
                       "or add swap / RAM.")
        if phase == "save":
            out.append("Rank 0 copies the whole gathered 16-bit model to CPU to save it: save a ZeRO checkpoint instead "
                       "and convert it offline (zero_to_fp32.py).")
        return out
    if phase == "initialize.move":
        out.append("deepspeed.initialize moves the whole model to every GPU (engine.py _configure_distributed_model: "
                   "self.module.to(self.device)) " + (f"unless it was built under zero.Init: {ZERO_INIT}." if z3 else
                   "and below ZeRO-3 the 16-bit model stays whole on every GPU: ZeRO-3 partitions it (with zero.Init "
                   "it is never whole), or a PEFT method / a smaller model."))
    elif phase == "initialize.cast":
        out.append("The cast ran on the GPU, so the model was already there: do not call model.cuda()/.to('cuda') before "
                   "deepspeed.initialize.")
    elif phase == "initialize.partition" and z3:
        out.append("ZeRO-3 partitions parameters on a GPU that is already full (the moved model is still cached): "
                   f"{ZERO_INIT}.")
    elif phase in ("initialize.partition", "initialize.optimizer"):
        out.append("Optimizer buffers on the GPU: offload_optimizer to cpu"
                   + (", ZeRO stage 2 or 3" if below3 else "") + ", smaller reduce_bucket_size"
                   + (" / sub_group_size" if z3 else "") + ".")
    elif phase == "forward":
        out.append("Activations" + (" and gathered parameters" if z3 else "") + ": smaller micro-batch "
                   "(train_micro_batch_size_per_gpu / per_device_train_batch_size) with more gradient accumulation, "
                   "shorter sequences" + ("" if f.checkpointing else ", gradient checkpointing")
                   + (", smaller stage3_max_live_parameters / stage3_prefetch_bucket_size" if z3 else "") + ".")
    elif phase == "backward":
        out.append("Gradients, activation gradients and reduce buckets: "
                   + ("" if f.checkpointing else "gradient checkpointing, ") + "smaller micro-batch, smaller "
                   "reduce_bucket_size" + (", ZeRO-2 partitions the gradients" if stage in (0, 1) else "") + ".")
    elif phase == "optimizer_step":
        out.append("Optimizer states" + (" (alive from the first step on: the steady state)" if steady else
                   " are created at the first step") + ": offload_optimizer to cpu"
                   + (", a higher ZeRO stage" if below3 else "") + (", smaller sub_group_size" if z3 else "") + ".")
    elif phase == "save":
        out.append("Saving gathers the 16-bit weights" + (": set stage3_gather_16bit_weights_on_model_save false and "
                   "convert the checkpoint offline with zero_to_fp32.py." if z3 else ": save a ZeRO checkpoint "
                   "(engine.save_checkpoint) instead of the whole model."))
    elif phase == "load":
        out.append("The model was on the GPU before deepspeed.initialize (device_map or .cuda()): let DeepSpeed place it"
                   + (f", and {ZERO_INIT}." if z3 else "."))
    return out
