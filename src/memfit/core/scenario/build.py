"""``build_scenario``: the checked inputs resolved into a typed ``Scenario`` (model, PEFT method,
DeepSpeed config or the framework's settings, hardware, load, training, runtime), and
``describe_scenario``, what a plan's JSON says of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memfit.core.scenario.inputs import ScenarioInputs
from memfit.core.scenario.types import Scenario
from memfit.core.scenario.validate import check_inputs, count_value, input_label, positive_int
from memfit.errors import MemfitError


def build_scenario(inputs: ScenarioInputs) -> Scenario:
    """Resolve model, PEFT method, DeepSpeed config and hardware into a ``Scenario``."""
    from memfit.core.catalog import resolve_model_config
    from memfit.core.dsconfig import AutoContext, parse_deepspeed_config, read_deepspeed_json, trainer_defaults
    from memfit.core.frameworks.resolve import apply_input_files, resolve_framework_settings
    from memfit.core.hardware import DEFAULT_CPU_RAM, DEFAULT_GPU, Hardware, parse_gpus, parse_size
    from memfit.core.peft.params import apply_peft
    from memfit.core.peft.parse import load_adapter_config, parse_peft_options
    from memfit.core.scenario.types import LoadSettings, Scenario, TrainSettings

    inputs = apply_input_files(check_inputs(inputs))
    _transformers_release(inputs)
    if not inputs.model:
        raise MemfitError("no model given: pass --model (e.g. --model kakaobrain/kogpt) or a scenario file")
    source = resolve_model_config(inputs.model, trust_remote_code=bool(inputs.trust_remote_code))
    base = _model_shape(source, inputs)
    method = inputs.peft_method or "full"
    if method.endswith(".json") or Path(method).is_file():
        if inputs.peft_options:
            raise MemfitError("PEFT options cannot be combined with an adapter_config.json")
        spec = load_adapter_config(method)
    else:
        spec = parse_peft_options(method, **inputs.peft_options)
    model = apply_peft(base, spec)
    _refuse_adapters_on_separate_experts(model, inputs)

    count, gpu = parse_gpus(inputs.gpus or f"1x{DEFAULT_GPU}")
    nodes = inputs.nodes if inputs.nodes is not None else 1
    hw = Hardware(gpu=gpu, gpus_per_node=count, nodes=nodes,
                  cpu_ram_bytes=parse_size(inputs.cpu_ram or DEFAULT_CPU_RAM, what=input_label("cpu_ram")),
                  nvme_bytes=parse_size(inputs.nvme, what=input_label("nvme")) if inputs.nvme else None,
                  shared_gpu=bool(inputs.shared_gpu),
                  host_reserve_bytes=parse_size(inputs.host_reserve, what=input_label("host_reserve"))
                  if inputs.host_reserve else None,
                  swap_bytes=parse_size(inputs.swap, what=input_label("swap")) if inputs.swap else 0)
    has_ds_json = bool(inputs.deepspeed or inputs.deepspeed_inline)
    if inputs.precision is not None:
        modes = ("fp16", "bf16", "fp32") if has_ds_json or inputs.framework == "deepspeed" else \
            ("fp16", "bf16", "fp32", "amp_fp16", "amp_bf16")
        if inputs.precision not in modes:
            raise MemfitError(f"{_said(inputs, 'precision')}: invalid value {inputs.precision!r} with DeepSpeed; valid: "
                              f"{', '.join(modes)} (amp_* are the torch/DDP/FSDP precision modes)")
    fw = resolve_framework_settings(inputs, hw, has_deepspeed_json=has_ds_json)
    micro = inputs.micro_batch
    if fw.framework == "deepspeed":
        if inputs.precision is not None and inputs.precision not in ("fp16", "bf16", "fp32"):
            raise MemfitError(f"{input_label('precision')} must be fp16, bf16 or fp32 under DeepSpeed, got "
                              f"{inputs.precision!r}")
        precision = inputs.precision or ("bf16" if gpu.bf16 else "fp16")
        precision_why = (f"{input_label('precision')}" if inputs.precision else
                         f"the default for the GPU ({gpu.name} {'supports' if gpu.bf16 else 'has no'} bf16; "
                         "--precision chooses)")
    else:  # the precision mode is the torch settings'; the stub DeepSpeed config only carries the batch
        precision, precision_why = ("bf16" if gpu.bf16 else "fp16"), "unused outside DeepSpeed"
    if inputs.deepspeed:
        raw = read_deepspeed_json(inputs.deepspeed)
    elif inputs.deepspeed_inline is not None:
        raw = inputs.deepspeed_inline
    else:  # no config: the one the flags describe, said in a finding
        raw = {"train_micro_batch_size_per_gpu": micro or 1, "gradient_accumulation_steps": inputs.grad_accum or 1,
               "zero_optimization": {"stage": 0}}
        if precision != "fp32":
            raw[precision] = {"enabled": True}
    if has_ds_json and fw.framework == "deepspeed":
        raw = _old_trainer_batch_keys(raw, inputs, micro)
    fills, sources = trainer_defaults(raw, precision=precision, precision_why=precision_why)
    for name, field in (("micro_batch_size", "micro_batch"), ("gradient_accumulation_steps", "grad_accum"),
                        ("precision", "precision"), ("max_grad_norm", "max_grad_norm"), ("weight_decay", "weight_decay")):
        if field in inputs.origins:
            sources[name] = inputs.origins[field]
    if fw.framework == "deepspeed":
        for name in ("max_grad_norm", "weight_decay"):  # the Trainer's, filling "auto" and checked against the config
            if getattr(inputs, name) is not None:
                fills[name] = getattr(inputs, name)
    if micro is not None:
        fills["micro_batch_size"] = micro
    elif isinstance(raw.get("train_micro_batch_size_per_gpu"), str):  # "auto" without --micro-batch
        fills["micro_batch_size"], sources["micro_batch_size"] = 1, "memfit's default (--micro-batch chooses)"
    if inputs.grad_accum is not None:
        fills["gradient_accumulation_steps"] = inputs.grad_accum
    elif isinstance(raw.get("gradient_accumulation_steps"), str):
        fills["gradient_accumulation_steps"] = 1
        sources["gradient_accumulation_steps"] = "transformers' TrainingArguments default (--grad-accum chooses)"
    if inputs.precision is not None and fw.framework == "deepspeed":
        fills["precision"] = precision
    ctx = AutoContext(world_size=hw.world_size, hidden_size=base.arch.hidden_size, sources=sources,
                      name=f"DeepSpeed config {inputs.deepspeed}" if inputs.deepspeed else "DeepSpeed config", **fills)
    ds = parse_deepspeed_config(raw, context=ctx)
    from memfit.core.dsconfig import resolve_auto

    ds_json = resolve_auto(raw, ctx)
    if not inputs.deepspeed and inputs.deepspeed_inline is None and fw.framework == "deepspeed":
        from dataclasses import replace as _replace

        ds = _replace(ds, notes=ds.notes + (
            f"no DeepSpeed config given: memfit plans ZeRO stage 0, {precision} ({precision_why}), micro batch "
            f"{raw['train_micro_batch_size_per_gpu']}, gradient accumulation {raw['gradient_accumulation_steps']}",))
    if micro is None:
        micro = ds.train_micro_batch_size_per_gpu
    elif micro != ds.train_micro_batch_size_per_gpu:
        raise MemfitError(f"{_said(inputs, 'micro_batch')} = {micro} contradicts {inputs.deepspeed or 'the inline DeepSpeed config'}"
                          f": train_micro_batch_size_per_gpu = {ds.train_micro_batch_size_per_gpu} (the Trainer refuses "
                          'the mismatch too: write "auto" in the config, or give the same value)')
    from memfit.core.stack.resolve import resolve_stack

    stack = resolve_stack(inputs, framework=fw.framework)
    low_cpu, stack_notes = _low_cpu_mem_usage(inputs, stack, fw)
    if fw.framework == "deepspeed":
        from memfit.core.stack.deepspeed import apply_release_defaults

        ds, ds_notes = apply_release_defaults(ds, raw, stack)
        stack_notes += ds_notes
    if inputs.fsdp_loading is not None and fw.framework not in ("fsdp", "fsdp2"):
        raise MemfitError(f"{_said(inputs, 'fsdp_loading')}: applies to FSDP only (the framework is {fw.framework})")
    if inputs.fsdp_loading is not None:
        from memfit.core.scenario.types import FSDP_LOADINGS

        if inputs.fsdp_loading in FSDP_LOADINGS:
            stack_notes += (f"FSDP loading {inputs.fsdp_loading} ({_said(inputs, 'fsdp_loading')}, the script's own "
                            f"loader; not the stack's from_pretrained path): {FSDP_LOADINGS[inputs.fsdp_loading]}",)
    load_dtype, dtype_why = inputs.load_dtype, ""
    if load_dtype is None:
        from memfit.core.checkpoint import saved_dtype
        from memfit.core.inputs.common import DTYPE_NAMES
        from memfit.core.stack.transformers import load_dtype_default

        given = source.config.get("torch_dtype", source.config.get("dtype"))  # as saved_dtype reads it
        load_dtype, dtype_why = load_dtype_default(stack.transformers, quantized=fw.quant.enabled,
                                                   config_dtype=DTYPE_NAMES[saved_dtype(source.config)] if given else None)
    load = LoadSettings(dtype=load_dtype, dtype_why=dtype_why, zero_init=bool(inputs.zero_init), low_cpu_mem_usage=low_cpu,
                        fsdp_loading=inputs.fsdp_loading,
                        checkpoint=_checkpoint_layout(inputs, source, model))
    if spec.method == "delora" and fw.framework == "deepspeed" and ds.zero.stage == 3 and load.zero_init:
        # peft 0.21 tuners/delora/layer.py DeloraLayer.update_layer: w_norm = torch.norm(w.data, dim=0) of
        # the base weight, which under zero.Init is ZeRO-3's empty partitioned placeholder (not "meta")
        raise MemfitError(
            f"{_said(inputs, 'zero_init')}: DeLoRA under ZeRO-3's zero.Init trains nothing: peft builds each "
            "adapter's delora_w_norm as torch.norm of the base weight (tuners/delora/layer.py update_layer), "
            "which under zero.Init is ZeRO-3's empty placeholder, so the norm is 0 and the adapter's input is "
            "multiplied by it; build the model without zero.Init (zero_init: false) or use ZeRO-2")
    if spec.method == "xlora" and fw.quant.enabled:
        # peft 0.21.2 tuners/xlora/model.py convert_layers_to_xlora swaps the forward of lora.Linear, lora.Embedding
        # and lora.Conv2d only; an expert on a bitsandbytes layer is a lora.bnb.Linear4bit/Linear8bitLt (tuners/
        # lora/bnb.py: nn.Module + LoraLayer), which X-LoRA leaves unscaled and the classifier does not count
        raise MemfitError(
            f"{_said(inputs, 'quantization')}: X-LoRA on a bitsandbytes-quantized base is not modelled: peft's "
            "convert_layers_to_xlora swaps only lora.Linear/Embedding/Conv2d, so the experts on quantized layers "
            "(lora.bnb.Linear4bit/Linear8bitLt) run unscaled and outside the classifier's layer count")
    seq_len, batch_shape = _sequence_shape(inputs, micro, hw.world_size)
    attention, attention_why = _attention(base, inputs.attention, stack)
    train = TrainSettings(
        seq_len=seq_len,
        micro_batch=micro,
        gradient_checkpointing=bool(inputs.gradient_checkpointing),
        model_parameters=inputs.model_parameters or "trainable",
        attention=attention,
        target_len=_target_len(base, inputs.target_len),
        batch_shape=batch_shape,
        dataloader_workers=count_value(inputs.dataloader_workers, "dataloader_workers"),
        dataloader_pin_memory=bool(inputs.dataloader_pin_memory),
        dataset_tokens=count_value(inputs.dataset_tokens, "dataset_tokens"),
        save=inputs.save is not False,
    )
    from memfit.core.scenario.run_settings import epoch_settings, eval_settings

    ev = eval_settings(inputs, train, model)
    epoch = epoch_settings(inputs, train)
    from memfit.core.stack.deepspeed import allocation_line

    sc = Scenario(name=inputs.name or f"{source.name} ({spec.method})", model_ref=source.name, model=model,
                  peft=spec, deepspeed=ds, deepspeed_json=ds_json, hardware=hw, load=load, train=train,
                  ds_version=allocation_line(stack.deepspeed, where=_said(inputs, "ds_version")),
                  accelerator=inputs.accelerator or "cuda", runtime=runtime_settings(inputs, stack),
                  framework=fw.framework, torch=fw.torch, quant=fw.quant, ddp=fw.ddp, fsdp=fw.fsdp,
                  eval=ev, epoch=epoch, input_notes=tuple(inputs.input_notes) + stack_notes,
                  input_warnings=tuple(inputs.input_warnings) + _cpu_run_warning(inputs), stack=stack)
    from dataclasses import replace as _replace

    from memfit.core.scenario.assumptions import assumptions

    return _replace(sc, assumptions=assumptions(inputs, sc, precision_why=precision_why, attention_why=attention_why))


def _cpu_run_warning(inputs: ScenarioInputs) -> tuple[str, ...]:
    """A CPU run (accelerate's or the Trainer's ``use_cpu``) next to GPUs the inputs also name: the GPUs
    hold nothing in the plan, said where each came from."""
    origin = inputs.origins.get("accelerator", "")
    if inputs.accelerator != "cpu" or inputs.gpus is None or not ("use_cpu" in origin or "no_cuda" in origin):
        return ()  # a replay's CPU accelerator (memfit.replay) is not the user's use_cpu
    return (f"{_said(inputs, 'accelerator')} makes this a CPU run (planned with DeepSpeed's CPU accelerator: the "
            f"model and its states in host RAM); the GPUs of {_said(inputs, 'gpus')} ({inputs.gpus}) hold nothing "
            "in it. Drop use_cpu to plan the run on them",)


def _said(inputs: ScenarioInputs, name: str) -> str:
    """Where the value of field ``name`` came from (its flag, scenario key or file key)."""
    return inputs.origins.get(name) or input_label(name)


def _transformers_release(inputs: ScenarioInputs) -> tuple[int, int]:
    """``(major, minor)`` of ``transformers_version`` (``4.2``, ``4.46.3``, ``5.24.0.dev0``), checked
    wherever it is given by the stack's one reading of a version (``memfit.core.stack.releases``:
    a release line memfit knows, else one error line naming the lines it knows); not installed
    (``none``) or not given: the default release's."""
    from memfit.core.stack.releases import library, line_key, release_line

    version = inputs.transformers_version
    line = None if version is None else release_line("transformers", version,
                                                     where=_said(inputs, "transformers_version"))
    return line_key(line or library("transformers").default)


def _old_trainer_batch_keys(raw: dict, inputs: ScenarioInputs, micro: int | None) -> dict:
    """transformers before 4.6 (``integrations.py: init_deepspeed``, 4.2.0-4.5.1) refuses
    ``train_batch_size``, ``train_micro_batch_size_per_gpu`` and ``gradient_accumulation_steps`` in the
    DeepSpeed config and writes the last two from its arguments (``per_device_train_batch_size``,
    ``gradient_accumulation_steps``); 4.6 introduced "auto" instead."""
    version = inputs.transformers_version
    if version is None or _transformers_release(inputs) >= (4, 6):
        return raw
    written = [k for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
               if k in raw]
    if written:
        raise MemfitError(f"transformers {version}'s Trainer refuses {', '.join(written)} in the DeepSpeed config (\"Do "
                          "not include ... entries in the ds config file, as they will be set via "
                          "--per_device_train_batch_size\"): leave them out")
    if micro is None:
        raise MemfitError(f"transformers {version}'s Trainer writes train_micro_batch_size_per_gpu from "
                          "per_device_train_batch_size: give it (--micro-batch, or a TrainingArguments file)")
    return {**raw, "train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": inputs.grad_accum or 1}


def _low_cpu_mem_usage(inputs: ScenarioInputs, stack, fw) -> tuple[bool, tuple[str, ...]]:
    """``from_pretrained``'s low_cpu_mem_usage: as given, else the default of the stack's transformers
    (``memfit.core.stack.transformers``), said; a False that the release ignores is said too."""
    from memfit.core.stack.transformers import honours_low_cpu_mem_usage_false, low_cpu_mem_usage_default

    line = stack.transformers
    if inputs.low_cpu_mem_usage is not None:
        if not inputs.low_cpu_mem_usage and not honours_low_cpu_mem_usage_false(line):
            return True, (f"low_cpu_mem_usage false is ignored by transformers {line} (dropped since 4.51): the "
                          "checkpoint loads straight into a meta-device model",)
        return bool(inputs.low_cpu_mem_usage), ()
    value, why = low_cpu_mem_usage_default(
        line, device_map=False, quantized=fw.quant.enabled,
        fsdp_efficient=fw.framework in ("fsdp", "fsdp2") and fw.fsdp.cpu_ram_efficient_loading)
    return value, (f"from_pretrained low_cpu_mem_usage={value}: {why}",)


def runtime_settings(inputs: ScenarioInputs, stack=None):  # -> RuntimeSettings
    """torch version, PYTORCH_CUDA_ALLOC_CONF (from the environment only when asked), CUDA version and
    DeepSpeed's pinning backend, validated (a bad value is one MemfitError line). With ``stack``
    (``memfit.core.stack``) the torch and CUDA versions are the stack's: the runtime is a view of it."""
    import os

    from memfit.core.alloc.versions import DEFAULT_TORCH, resolve_torch_version
    from memfit.core.scenario.types import RuntimeSettings

    if inputs.alloc_conf_from_env is not None and not isinstance(inputs.alloc_conf_from_env, bool):
        raise MemfitError(f"alloc_conf_from_env must be true or false, got {inputs.alloc_conf_from_env!r}")
    version = resolve_torch_version(stack.torch if stack is not None else inputs.torch_version or DEFAULT_TORCH)
    conf, source = inputs.alloc_conf or "", ""
    if inputs.alloc_conf_from_env:
        if inputs.alloc_conf:
            raise MemfitError("give the allocator config either as --alloc-conf or from the environment, not both")
        for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF") if version.at_least("2.9") else ("PYTORCH_CUDA_ALLOC_CONF",):
            if os.environ.get(var):
                conf, source = os.environ[var], f"{var} from the environment"
                break
        else:
            source = "asked to read PYTORCH_CUDA_ALLOC_CONF from the environment: not set, torch's defaults"
    return RuntimeSettings(torch_version=version.name, alloc_conf=conf, alloc_conf_source=source,
                           cuda_version=stack.cuda if stack is not None else inputs.cuda_version,
                           pin_memory_backend=inputs.pin_memory_backend or "torch", **_bitsandbytes(inputs, stack))


def _bitsandbytes(inputs: ScenarioInputs, stack) -> dict:
    """The runtime's bitsandbytes release (its matmuls' saved tensors, ``memfit.core.quant_kernels``):
    the stack's, as given or read, when it names one; else the default (noted as assumed)."""
    if stack is not None:
        entry = stack.entry("bitsandbytes")
        if entry.assumed or entry.line is None or entry.version is None:
            return {}
        return {"bitsandbytes_version": entry.version, "bitsandbytes_version_given": True}
    return ({"bitsandbytes_version": inputs.bitsandbytes_version, "bitsandbytes_version_given": True}
            if inputs.bitsandbytes_version else {})


def _refuse_adapters_on_separate_experts(model, inputs: ScenarioInputs) -> None:  # noqa: ANN001 (ModelShape)
    """Before transformers 5.0 each expert is its own nn.Linear (``families.moe.per_expert_params``):
    peft can adapt them (``all-linear`` does), but each sees only the tokens routed to it, which the
    adapters' activation model does not follow: refused in one line rather than planned as if every
    expert saw every token."""
    import re

    from memfit.core.peft.adapter_params import is_adapter_param

    hit = next((m.group(1) for p in model.params if p.trainable and is_adapter_param(p.name)
                for m in [re.search(r"(model\.layers\.\d+\.[\w.]*?experts\.\d+\.\w+)\.", p.name)] if m), None)
    if hit is not None:
        raise MemfitError(f"{_said(inputs, 'peft_options')}: adapters on transformers 4.x's separate experts "
                          f"({hit} and the others) are not modelled (each expert runs on its "
                          "routed tokens only); target the attention projections, or plan on transformers 5.x")


def _model_shape(source, inputs: ScenarioInputs):
    """The pure builder's shapes, or, for a model_type transformers ships without a pure builder,
    the meta build's (torch and transformers run: slower, and said so in the shape's notes)."""
    from memfit.core.shapes import NoPureBuilder, build_model_shape
    from memfit.core.stack.resolve import resolve_stack

    line = resolve_stack(inputs, framework=inputs.framework or "torch").transformers
    try:
        return build_model_shape(source, task=inputs.task, trust_remote_code=bool(inputs.trust_remote_code),
                                 transformers_line=line)
    except NoPureBuilder:
        from memfit.core.families import TRANSFORMERS_MODEL_TYPES
        from memfit.core.families.transformers_types import model_type_release, model_types_of

        if source.model_type not in TRANSFORMERS_MODEL_TYPES and not inputs.trust_remote_code:
            raise
        if line is not None and source.model_type not in model_types_of(line) and not inputs.trust_remote_code:
            raise MemfitError(f"model_type {source.model_type!r} is in transformers from "
                              f"{model_type_release(source.model_type)}; the stack's transformers {line} does not "
                              "ship it (state the release the run uses)") from None
        try:
            from memfit.exact.meta_build import shape_from_meta_build
        except ImportError as exc:
            raise MemfitError(f"model_type {source.model_type!r} has no pure-Python builder and the exact path "
                              "needs torch and transformers (pip install 'memfit[exact]')") from exc
        return shape_from_meta_build(source, task=inputs.task, trust_remote_code=bool(inputs.trust_remote_code))


def _attention(shape, requested: str | None, stack=None) -> tuple[str, str]:
    """``(implementation, why)``: transformers' choice for the family in the stack's release
    (``memfit.core.stack.attention``: eager before 4.36's dispatch, then sdpa where the release's classes
    support it and torch allows), or the requested one if the family supports it (the same one-line
    refusal as the exact path, and the release's own refusal of sdpa)."""
    from memfit.core.families import FAMILIES
    from memfit.core.families.attention import IMPLEMENTATIONS, resolve
    from memfit.core.stack.attention import default_attention, requested_sdpa, stack_torch_version

    line, torch = (stack.transformers, stack_torch_version(stack)) if stack is not None else (None, "")
    if shape.arch.model_type in FAMILIES:
        if requested is None:
            chosen, why = default_attention(shape.arch.model_type, line, torch)
            return (chosen, why) if chosen is not None else (resolve(shape.arch.model_type, None), "transformers' choice")
        if requested == "sdpa" and requested_sdpa(shape.arch.model_type, line, torch):
            return "sdpa", "requested"
        return resolve(shape.arch.model_type, requested), "requested"
    if requested is not None and requested not in IMPLEMENTATIONS:
        raise MemfitError(f"attention must be one of {', '.join(IMPLEMENTATIONS)}, got {requested!r}")
    return requested or "sdpa", "requested" if requested else "transformers' choice"


def _target_len(shape, value: Any) -> int | None:
    if value is None:
        return None
    if not shape.arch.num_encoder_layers:
        raise MemfitError(f"target_len applies to encoder-decoder models; {shape.architecture} has no decoder "
                          "of its own (use seq_len)")
    return positive_int(value, "target_len")


def _sequence_shape(inputs: ScenarioInputs, micro: int, world: int):
    """``(seq_len, batch_shape)``: the given seq_len, or the largest batch of a length distribution."""
    from memfit.core.batch_shapes import longest_batch, read_lengths

    if inputs.lengths is None:
        if inputs.batching is not None:
            raise MemfitError(f"{_said(inputs, 'batching')} needs a length distribution (--lengths FILE)")
        if inputs.max_seq_length is not None:
            if inputs.seq_len is not None:
                raise MemfitError(f"{_said(inputs, 'max_seq_length')} truncates the samples of a length distribution "
                                  f"(--lengths FILE); without one give either it or {_said(inputs, 'seq_len')}")
            return positive_int(inputs.max_seq_length, "max_seq_length"), None
        return positive_int(inputs.seq_len if inputs.seq_len is not None else 2048, "seq_len"), None
    if inputs.seq_len is not None:
        raise MemfitError("give either seq_len or lengths (the plan then takes the largest batch's length)")
    cap = None if inputs.max_seq_length is None else positive_int(inputs.max_seq_length, "max_seq_length")
    shape = longest_batch(read_lengths(inputs.lengths), rule=inputs.batching or "pad-longest", micro_batch=micro,
                          max_seq_length=cap, world_size=world)
    return shape.seq_len, shape


def describe_scenario(sc: Scenario) -> dict[str, Any]:
    """The resolved scenario, for JSON output and fixtures."""
    from memfit.core.alloc.versions import resolve_torch_version

    z = sc.deepspeed.zero
    return {
        "name": sc.name,
        "model": sc.model_ref,
        "architecture": sc.model.architecture,
        "peft": sc.peft.method,
        "deepspeed_version": sc.ds_version,
        "zero_stage": z.stage,
        "precision": sc.deepspeed.precision,
        "offload_optimizer": z.offload_optimizer.device,
        "offload_param": z.offload_param.device,
        "world_size": sc.world_size,
        "gpus_per_node": sc.hardware.gpus_per_node,
        "nodes": sc.hardware.nodes,
        "gpu": sc.hardware.gpu.name,
        "gpu_total_bytes": sc.hardware.gpu.total_bytes,
        "cpu_ram_bytes": sc.hardware.cpu_ram_bytes,
        "swap_bytes": sc.hardware.swap_bytes,
        "load_dtype": sc.load.dtype,
        "zero_init": sc.load.zero_init,
        "seq_len": sc.train.seq_len,
        "task": sc.model.arch.task,
        "target_len": sc.train.target_len,
        "attention": sc.train.attention,
        "batch_shape": None if sc.train.batch_shape is None else {
            "rule": sc.train.batch_shape.rule, "micro_batch": sc.train.batch_shape.micro_batch,
            "seq_len": sc.train.batch_shape.seq_len, "probability": sc.train.batch_shape.probability,
            "batches_per_epoch": sc.train.batch_shape.batches_per_epoch},
        "micro_batch": sc.train.micro_batch,
        "gradient_checkpointing": sc.train.gradient_checkpointing,
        "accelerator": sc.accelerator,
        "torch_version": sc.runtime.torch_version,
        "alloc_conf": sc.runtime.alloc_conf,
        "cuda_version": sc.runtime.cuda_version or resolve_torch_version(sc.runtime.torch_version).default_cuda,
        "pin_memory_backend": sc.runtime.pin_memory_backend,
        "stack": sc.versions.as_dict(),
        "bitsandbytes_version": sc.runtime.bitsandbytes_version,
        "framework": sc.framework,
        **({} if sc.framework == "deepspeed" else {
            "precision_mode": sc.torch.precision, "optim": sc.torch.optim,
            "gradient_accumulation_steps": sc.torch.gradient_accumulation_steps}),
        **({"quantization": sc.quant.method, "bnb_4bit_quant_type": sc.quant.quant_type,
            "bnb_4bit_quant_storage": sc.quant.quant_storage} if sc.quant.enabled else {}),
        "assumptions": [{"kind": a.kind, "what": a.what, "value": a.value, "why": a.why} for a in sc.assumptions],
    }


def _checkpoint_layout(inputs: ScenarioInputs, source, model):
    """The checkpoint's shards (``memfit.core.checkpoint``): from the index file given, else from
    ``max_shard_size`` or the saving transformers version's default."""
    from memfit.core.checkpoint import checkpoint_key, layout_from_config, layout_from_index
    from memfit.core.hardware import parse_size
    from memfit.core.ledger.context import is_adapter_param

    tensors = [(checkpoint_key(p.name), p.numel) for p in model.params if not is_adapter_param(p.name)]
    if inputs.checkpoint_index:
        return layout_from_index(inputs.checkpoint_index, tensors, source.config)
    limit = parse_size(inputs.max_shard_size, what="max_shard_size") if inputs.max_shard_size else None
    return layout_from_config(tensors, source.config, max_shard_size=limit)
