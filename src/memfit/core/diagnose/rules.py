"""The rules that map traceback frames and progress lines to ledger phases (DeepSpeed 0.19.8 and
0.5.10 function names, checked against their sources in the tests)."""

from __future__ import annotations

import re

from memfit.core.lean_dataclass import dataclass
from memfit.core.diagnose.logtext import LogLine
from memfit.core.diagnose.results import Frame


# ----------------------------------------------------------------------------------- frame rules

@dataclass(frozen=True, slots=True)
class _Rule:
    path: str
    """Substring of the frame's path (``/`` separators)."""
    functions: frozenset[str]
    """Function names it covers; empty: any function in that file."""
    phase: str | None
    """None: the frame only tells the family (e.g. ``deepspeed.initialize``)."""
    family: str | None
    what: str
    code: tuple[tuple[str, str, str], ...] = ()
    """(substring of the frame's source line, phase, what): checked before ``phase``."""
    zero3_phase: str | None = None
    """The phase under ZeRO-3, where the replay's seams put it elsewhere."""


def _r(path, funcs, phase, what, *, family=None, code=(), zero3=None) -> _Rule:
    fam = family if family is not None else (phase.split(".")[0] if phase else None)
    return _Rule(path, frozenset(funcs.split()) if funcs else frozenset(), phase, fam, what, tuple(code), zero3)


_ENG = "deepspeed/runtime/engine.py"
_S3 = "deepspeed/runtime/zero/stage3.py"
_S12 = "deepspeed/runtime/zero/stage_1_and_2.py"
_PP = "deepspeed/runtime/zero/partition_parameters.py"
_PO = "deepspeed/runtime/zero/parameter_offload.py"
_MOVE_WHAT = "DeepSpeed moves the whole model to the GPU (every rank holds all of it until ZeRO-3 partitions it)"
_CAST_WHAT = "DeepSpeed casts the parameters to fp16/bf16 where they sit"

# Outermost first is how tracebacks print; the phase is the innermost frame that names one within
# the family of the outermost frame that names a family (so ZeRO-3 partitioning inside a forward is
# the forward, and zero.Init partitioning inside from_pretrained is the load).
RULES: tuple[_Rule, ...] = (
    # load
    _r("transformers/modeling_utils.py", "from_pretrained _load_pretrained_model _load_state_dict_into_model "
       "load_state_dict _load_state_dict_into_meta_model load_shard_file _load_checkpoint", "load",
       "transformers from_pretrained builds the model and loads its weights (fp32 unless torch_dtype is given)"),
    _r("transformers/models/auto/auto_factory.py", "from_pretrained", "load",
       "transformers from_pretrained builds the model and loads its weights"),
    _r("transformers/integrations/deepspeed.py", "_load_state_dict_into_zero3_model", "load",
       "transformers loads weights into a model built under zero.Init"),
    _r("peft/mapping", "get_peft_model", "load", "PEFT wraps the model and creates the adapter weights"),
    _r("peft/peft_model.py", "__init__ from_pretrained", "load", "PEFT wraps the model and creates the adapter weights"),
    _r("safetensors/torch.py", "load_file load", "load", "safetensors reads a weights file into memory"),
    _r("torch/serialization.py", "load", "load", "torch.load reads a checkpoint into memory"),
    _r("torch/nn/modules/module.py", "to cuda", "load",
       "the script moves the whole model to the GPU itself (model.to/.cuda), before or without DeepSpeed"),
    # initialize: family only
    _r("deepspeed/__init__.py", "initialize", None, "deepspeed.initialize", family="initialize"),
    _r(_ENG, "__init__", None, "DeepSpeedEngine.__init__", family="initialize"),
    _r("transformers/integrations/deepspeed.py", "deepspeed_init", None, "the HF Trainer calls deepspeed.initialize",
       family="initialize"),
    _r("transformers/deepspeed.py", "deepspeed_init", None, "the HF Trainer calls deepspeed.initialize",
       family="initialize"),
    _r("accelerate/accelerator.py", "prepare _prepare_deepspeed", None, "accelerate calls deepspeed.initialize",
       family="initialize"),
    # initialize.cast / initialize.move
    _r(_ENG, "_configure_distributed_model", None, "DeepSpeedEngine._configure_distributed_model", family="initialize",
       code=((".half()", "initialize.cast", _CAST_WHAT + " (module.half(), DeepSpeed <= 0.6)"),
             (".bfloat16()", "initialize.cast", _CAST_WHAT + " (module.bfloat16())"),
             ("_cast_module_mixed_precision", "initialize.cast", _CAST_WHAT + " (one parameter at a time)"),
             (".to(self.device)", "initialize.move", _MOVE_WHAT),
             ("_broadcast_model", "initialize.move", "DeepSpeed broadcasts rank 0's weights to every rank (in place)"))),
    _r(_ENG, "_cast_module_mixed_precision", "initialize.cast", _CAST_WHAT + " (one parameter at a time)"),
    _r(_ENG, "_broadcast_model", "initialize.move", "DeepSpeed broadcasts rank 0's weights to every rank (in place)"),
    # initialize.partition (ZeRO-3 conversion) and the basic optimizer before it
    _r(_ENG, "_configure_optimizer _configure_basic_optimizer", "initialize.optimizer",
       "DeepSpeed creates the optimizer", zero3="initialize.partition"),
    _r("deepspeed/ops/adam/cpu_adam.py", "__init__", "initialize.optimizer",
       "DeepSpeedCPUAdam is created (it loads, or JIT-builds, the cpu_adam op)", zero3="initialize.partition"),
    _r(_ENG, "_configure_zero_optimizer _configure_fp16_optimizer _configure_bf16_optimizer", "initialize.optimizer",
       "DeepSpeed wraps the optimizer in its ZeRO/fp16 optimizer"),
    _r(_S3, "_convert_to_zero_parameters initialize_ds_offload", "initialize.partition",
       "ZeRO-3 converts and partitions every parameter"),
    _r(_S3, "__init__", "initialize.optimizer", "the ZeRO-3 optimizer allocates its buffers",
       code=(("_convert_to_zero_parameters", "initialize.partition", "ZeRO-3 converts and partitions every parameter"),
             ("initialize_ds_offload", "initialize.partition", "ZeRO-3 converts and partitions every parameter"))),
    _r(_PO, "__init__ _convert_to_zero_parameters mark_persistent_parameters", "initialize.partition",
       "ZeRO-3 converts and partitions every parameter (DeepSpeedZeRoOffload)"),
    _r(_PP, "_partition_param _partition partition _convert_to_zero_parameters _zero_init_param "
       "_convert_to_deepspeed_param _post_init_method __init__", "initialize.partition",
       "ZeRO-3 partitions each parameter: torch.empty(ceil(p/W)) on the offload device, pinned under "
       "offload_param.pin_memory"),
    _r(_S3, "_create_fp16_partitions_with_defragmentation "
       "_create_param_groups_fp16_flat_cpu_memory _move_to_flat_buffer _create_fp32_partitions "
       "initialize_optimizer_states _setup_for_real_optimizer create_reduce_and_remove_grad_hooks "
       "_create_fp16_sub_groups _configure_tensor_swapping", "initialize.optimizer",
       "the ZeRO-3 optimizer allocates its buffers (flat 16-bit partitions, fp32 master, gradients)"),
    _r(_S12, "__init__ initialize_optimizer_states flatten_dense_tensors_aligned", "initialize.optimizer",
       "the ZeRO-1/2 optimizer allocates its flat buffers and fp32 master"),
    _r("deepspeed/runtime/fp16/fused_optimizer.py", "__init__ initialize_optimizer_states", "initialize.optimizer",
       "the fp16 optimizer wrapper allocates its flat buffers and fp32 master"),
    _r("deepspeed/runtime/bf16_optimizer.py", "__init__", "initialize.optimizer",
       "the bf16 optimizer wrapper allocates its fp32 master"),
    _r("deepspeed/runtime/zero/utils.py", "defragment", "initialize.optimizer",
       "ZeRO-3 defragments the 16-bit partitions into one flat buffer"),
    # forward
    _r(_ENG, "forward", "forward", "the forward pass (DeepSpeedEngine.forward)"),
    _r(_PO, "_pre_forward_module_hook pre_sub_module_forward_function _post_forward_module_hook "
       "post_sub_module_forward_function", "forward", "ZeRO-3 gathers a submodule's parameters for its forward"),
    _r(_S3, "_pre_forward_module_hook pre_sub_module_forward_function _post_forward_module_hook "
       "post_sub_module_forward_function", "forward", "ZeRO-3 gathers a submodule's parameters for its forward"),
    _r("torch/distributed/fsdp/_fully_shard/", "pre_forward _pre_forward unshard foreach_all_gather wait_for_unshard",
       "forward", "FSDP2 all-gathers a unit's parameters for its forward (fully_shard's unshard)"),
    _r("torch/distributed/fsdp/_fully_shard/", "pre_backward _pre_backward post_backward foreach_reduce",
       "backward", "FSDP2 gathers a unit's parameters or reduce-scatters its gradients in backward"),
    _r("torch/distributed/fsdp/_runtime_utils.py", "_pre_forward _pre_forward_unshard _unshard", "forward",
       "FSDP1 all-gathers a unit's flat parameter for its forward"),
    _r("torch/distributed/fsdp/_runtime_utils.py", "_pre_backward_hook _post_backward_hook _reduce_grad", "backward",
       "FSDP1 gathers a unit's parameters or reduce-scatters its gradients in backward"),
    _r("bitsandbytes/", "forward matmul_4bit dequantize_4bit", "forward",
       "bitsandbytes dequantizes a 4-bit weight for its matmul"),
    _r("bitsandbytes/", "backward", "backward", "bitsandbytes dequantizes a 4-bit weight for the backward matmul"),
    _r("transformers/models/", "forward", "forward", "the model's forward pass (activations)"),
    _r("peft/", "forward", "forward", "the PEFT model's forward pass"),
    _r("transformers/trainer.py", "compute_loss", "forward", "the HF Trainer's forward pass (compute_loss)"),
    _r("transformers/trainer.py", "training_step", None, "", family=None,
       code=(("compute_loss", "forward", "the HF Trainer's forward pass (compute_loss)"),
             ("backward", "backward", "the HF Trainer's backward pass"))),
    # backward
    _r(_ENG, "backward _backward_epilogue", "backward", "the backward pass (DeepSpeedEngine.backward)"),
    _r(_S3, "backward backward_prologue backward_epilogue reduce_ready_partitions_and_remove_grads "
       "reduce_independent_p_g_buckets_and_remove_grads "
       "__reduce_and_partition_ipg_grads partition_grads independent_gradient_partition_epilogue "
       "_pre_backward_module_hook pre_sub_module_backward_function reduce_partition_and_remove_grads",
       "backward", "ZeRO-3 reduces and partitions gradients during backward"),
    _r(_PO, "_pre_backward_module_hook pre_sub_module_backward_function", "backward",
       "ZeRO-3 gathers a submodule's parameters for its backward"),
    _r(_S12, "backward reduce_ready_partitions_and_remove_grads reduce_independent_p_g_buckets_and_remove_grads "
       "average_tensor allreduce_bucket", "backward", "ZeRO-1/2 reduces gradients during backward"),
    _r("deepspeed/runtime/fp16/loss_scaler.py", "backward", "backward", "the backward pass (scaled loss)"),
    _r("torch/_tensor.py", "backward", "backward", "autograd runs the backward pass (loss.backward())"),
    _r("torch/autograd/", "backward _engine_run_backward", "backward", "autograd runs the backward pass"),
    _r("torch/utils/checkpoint.py", "backward", "backward",
       "gradient checkpointing recomputes a layer's forward during backward"),
    _r("accelerate/accelerator.py", "backward", "backward", "the backward pass (accelerator.backward)"),
    # optimizer step
    _r(_ENG, "step _take_model_step", "optimizer_step", "the optimizer step (DeepSpeedEngine.step)"),
    _r(_S3, "step _optimizer_step _prepare_fp32_grad_for_sub_group unscale_and_clip_grads _post_step "
       "_reassign_or_swap_out_partitioned_parameters", "optimizer_step", "the ZeRO-3 optimizer step"),
    _r(_S12, "step", "optimizer_step", "the ZeRO-1/2 optimizer step"),
    _r("deepspeed/ops/adam/", "step", "optimizer_step", "the Adam step (optimizer states are created at the first)"),
    _r("torch/optim/", "step _init_group", "optimizer_step", "the optimizer step (states are created at the first)"),
    _r("deepspeed/runtime/fp16/fused_optimizer.py", "step", "optimizer_step", "the fp16 optimizer step"),
    _r("transformers/trainer.py", "_inner_training_loop", None, "", family=None,
       code=(("deepspeed_init", "", "the HF Trainer calls deepspeed.initialize"),
             ("optimizer.step", "optimizer_step", "the HF Trainer's optimizer step"),
             ("_save_checkpoint", "save", "the HF Trainer saves a checkpoint"))),
    # save
    _r(_ENG, "save_16bit_model save_fp16_model _zero3_consolidated_16bit_state_dict "
       "_zero3_consolidated_fp16_state_dict save_checkpoint _save_checkpoint _save_zero_checkpoint", "save",
       "DeepSpeed saves the model (ZeRO-3 gathers the 16-bit weights module by module, rank 0 copies them to CPU)"),
    _r("transformers/trainer.py", "_save_checkpoint save_model _save", "save", "the HF Trainer saves the model"),
    _r("transformers/modeling_utils.py", "save_pretrained", "save", "save_pretrained writes the weights"),
    _r("torch/serialization.py", "save", "save", "torch.save writes a checkpoint"),
)


@dataclass(frozen=True, slots=True)
class _Match:
    index: int
    frame: Frame
    phase: str | None
    family: str | None
    what: str


def _match_frame(i: int, f: Frame, zero3: bool) -> _Match | None:
    path = f.path.replace("\\", "/")
    for rule in RULES:
        if rule.path not in path or (rule.functions and f.function not in rule.functions):
            continue
        for sub, phase, what in rule.code:
            if sub in f.code:
                return _Match(i, f, phase or None, phase.split(".")[0] if phase else "initialize", what)
        if rule.family is None:
            return None
        phase = rule.zero3_phase if (zero3 and rule.zero3_phase) else rule.phase
        return _Match(i, f, phase, rule.family, rule.what)
    return None


def _call(f: Frame) -> str:
    code = f.code if len(f.code) <= 90 else f.code[:87] + "..."
    return f"{f.function} -> {code}" if code else f.function


def locate_phase(frames: tuple[Frame, ...], *, zero3: bool = False) -> tuple[str | None, str, Frame | None]:
    """(phase, reason, frame) from a traceback's frames (outermost first), or (None, reason, None).

    The outermost frame that names a family (load, initialize, forward, backward, optimizer_step,
    save) sets the context; the phase is the innermost frame of that family that names a phase.
    ``zero3`` moves the basic optimizer's construction into ``initialize.partition``, as the replay's
    seams do for ZeRO-3 (memfit/replay/deepspeed/seams.py)."""
    matches = [m for i, f in enumerate(frames) if (m := _match_frame(i, f, zero3)) is not None]
    if not matches:
        return None, "no frame of the traceback belongs to a phase memfit knows", None
    family = matches[0].family
    same = [m for m in matches if m.family == family and m.phase]
    if not same:
        m = matches[-1]
        where = f"{m.frame.short_path}, line {m.frame.line}"
        return None, f"inside {m.what} ({where}); no frame narrows it to one phase", None
    best = same[-1]
    reason = f"{_call(best.frame)}: {best.what} ({best.frame.short_path}, line {best.frame.line})"
    inner = matches[-1]  # named when it adds something: DeepSpeed/transformers code, not torch's plumbing
    if inner is not best and inner.what != best.what and "/torch/" not in "/" + inner.frame.short_path:
        reason += f"; innermost: {_call(inner.frame)} ({inner.what})"
    return best.phase, reason, best.frame


# Progress lines: the phase that runs after each (DeepSpeed 0.5.10 and 0.19.8 print all of them).
PROGRESS: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (re.compile(r"Loading checkpoint shards|loading weights file"), "load",
     "transformers is loading the weights"),
    (re.compile(r"DeepSpeed info: version="), "initialize.cast",
     "deepspeed.initialize has started (deepspeed/__init__.py: next the engine casts and moves the model)"),
    (re.compile(r"DeepSpeed Flops Profiler Enabled"), "initialize.partition",
     "the engine has cast and moved the model (engine.py, after _configure_distributed_model); next the optimizer "
     "and ZeRO partitioning"),
    (re.compile(r"Reduce bucket size \d+"), "initialize.partition",
     "the ZeRO optimizer has started (stage3.py/stage_1_and_2.py __init__)"),
    (re.compile(r"optimizer state initialized"), "initialize.optimizer",
     "the ZeRO optimizer has initialised its states (initialize_optimizer_states)"),
    (re.compile(r"DeepSpeed Final Optimizer = "), "forward", "deepspeed.initialize has finished"),
    (re.compile(r"\*\*\*\*\* Running training \*\*\*\*\*"), "forward",
     "the Trainer has set up the model and optimizer and starts training (transformers trainer.py "
     "_inner_training_loop, after _prepare_for_training)"),
    (re.compile(r"^\s*\d{1,3}%\|[^|]{0,80}\|\s*0/\d+ \["), "forward",
     "the Trainer's progress bar is at step 0: the first step is running"),
    (re.compile(r"^\s*\d{1,3}%\|[^|]{0,80}\|\s*[1-9]\d*/\d+ \["), "step2.forward",
     "the Trainer's progress bar has counted optimizer steps: the steady state (step 2 on) is running"),
    (re.compile(r"^\s*\{'loss': "), "step2.forward",
     "the Trainer logged a training loss (ProgressCallback.on_log): optimizer steps have run"),
    (re.compile(r"\bstep=\d+, skipped=\d+"), "forward", "training steps are running"),
    (re.compile(r"Saving model (?:weights|checkpoint)"), "save", "the model is being saved"),
)


def _progress_phase(lines: list[LogLine], before: int) -> tuple[str, str, int] | None:
    last = None
    for ln in lines:
        if ln.no >= before:
            break
        for pat, phase, what in PROGRESS:
            m = pat.search(ln.text)
            if m:
                last = (phase, what, ln.no, ln.text[m.start():].strip())
    if last is None:
        return None
    phase, what, no, text = last
    short = text if len(text) <= 80 else text[:77] + "..."
    return phase, f"last progress line before the failure (line {no}: {short!r}): {what}", no


_TRAINER_BAR = re.compile(r"^\s*\d{1,3}%\|[^|]{0,80}\|\s*(\d+)/(\d+) \[")
_LOSS_LINE = re.compile(r"^\s*\{'loss': ")


def trainer_steps(lines: list[LogLine], before: int) -> tuple[int, int] | None:
    """(optimizer steps done, log line) at the failure, from the Trainer's progress bar (its count)
    or a logged loss (at least one step), the last of either before line ``before``; None when the
    log shows neither."""
    last = None
    for ln in lines:
        if ln.no > before:
            break
        m = _TRAINER_BAR.match(ln.text)
        if m:
            last = (int(m.group(1)), ln.no)
        elif _LOSS_LINE.match(ln.text):
            last = (max(last[0] if last else 0, 1), ln.no)
    return last
