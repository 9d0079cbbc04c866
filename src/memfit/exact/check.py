"""Pre-flight check for training scripts: ``memfit.check(model, ds_config)`` just before
``deepspeed.initialize``, with the live model object.

It reads what the script really built (every parameter's shape, requires_grad and dtype, the
buffers, whether the model was built under ``deepspeed.zero.Init``), the machine's real devices
(torch.cuda for the GPUs, the OS for host RAM), plans the run with the same ledger as
``memfit plan`` and warns, or raises ``MemfitCheckError``, before the run goes out of memory.
"""

from __future__ import annotations

import os
import warnings

from typing import Any, Mapping

from memfit.core.ledger_types import Plan
from memfit.errors import MemfitError

_DTYPES = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16"}


class MemfitCheckError(MemfitError, MemoryError):
    """The plan says this run will not fit; the message names the phase and the device. A
    ``MemoryError`` (what the run would raise) and a ``MemfitError`` (what every memfit refusal is)."""

    def __init__(self, message: str, plan: Plan) -> None:
        super().__init__(message)
        self.plan = plan


class MemfitWarning(UserWarning):
    """A finding worth knowing before the run (the plan fits, but ...)."""


def _host_ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def _gpus() -> tuple[int, Any] | None:
    import torch

    from memfit.core.hardware import GpuSpec

    if not torch.cuda.is_available():
        return None
    count = torch.cuda.device_count()
    free, total = torch.cuda.mem_get_info(0)
    name = torch.cuda.get_device_name(0)
    major, _ = torch.cuda.get_device_capability(0)
    return count, GpuSpec(name=name, total_bytes=int(total), bf16=major >= 8)


def model_shape_of(model: Any):
    """The live model as a ``ModelShape``: its own parameters (names, shapes, requires_grad) and
    buffers; architecture numbers from its config when memfit knows the family."""
    from memfit.core.catalog import ModelConfigSource
    from memfit.core.model import ArchSpec, BufferSpec, ModelShape, ParamSpec
    from memfit.core.shapes import build_model_shape

    if not callable(getattr(model, "named_parameters", None)) or not callable(getattr(model, "named_buffers", None)):
        raise MemfitError(f"memfit.check: model must be a torch.nn.Module (the model you pass to deepspeed.initialize), "
                          f"got {type(model).__name__}")
    try:
        params = []
        for name, p in model.named_parameters():
            shape = tuple(getattr(p, "ds_shape", p.shape))  # zero.Init params keep their full shape in ds_shape
            qs = getattr(p, "quant_state", None)
            if qs is not None:  # a bitsandbytes 4-bit weight: its unquantized shape
                shape = tuple(qs.shape)
            params.append(ParamSpec(name=name, shape=tuple(int(x) for x in shape), trainable=bool(p.requires_grad)))
        buffers = tuple(BufferSpec(name=n, shape=tuple(int(x) for x in b.shape), dtype=_DTYPES.get(str(b.dtype), "fp32"),
                                   persistent=True) for n, b in model.named_buffers())
    except MemfitError:
        raise
    except Exception as e:  # an object that only looks like a Module
        raise MemfitError(f"memfit.check: cannot read the model's parameters ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''})") from None
    if not params:
        raise MemfitError("memfit.check: the model has no parameters (nothing for DeepSpeed to train)")
    cfg = getattr(model, "config", None)
    arch = None
    if cfg is not None and hasattr(cfg, "to_dict"):
        try:
            arch = build_model_shape(ModelConfigSource(name=type(model).__name__, config=cfg.to_dict(), path=None,
                                                       origin="local"), transformers_line=_installed_line()).arch
        except MemfitError:
            arch = None
    if arch is None:
        arch = ArchSpec(model_type="unknown", num_layers=1, hidden_size=1, num_heads=1, num_kv_heads=1, head_dim=1,
                        intermediate_size=1, vocab_size=1)
    return ModelShape(name=type(model).__name__, architecture=type(model).__name__, arch=arch, params=tuple(params),
                      buffers=buffers)



def _installed_line() -> str | None:
    """The release line of the transformers this process runs (the model was built by it: Falcon's
    attention and config differ from 5.25, ``families.falcon.at_release``); None when it is not
    importable or is a line memfit does not know (then memfit's default release)."""
    try:
        import transformers

        from memfit.core.stack.releases import release_line

        return release_line("transformers", transformers.__version__, where="the installed transformers")
    except (ImportError, MemfitError):
        return None

def check(model: Any, ds_config: Mapping[str, Any] | str | None = None, *, gpus: str | None = None, nodes: int = 1,
          cpu_ram: str | int | None = None, seq_len: int = 2048, micro_batch: int | None = None,
          gradient_checkpointing: bool | None = None, model_parameters: str = "trainable",
          deepspeed_version: str = "0.19", raise_on_failure: bool = True, warn: bool = True,
          framework: str | None = None, precision: str | None = None, optim: str | None = None,
          grad_accum: int | None = None, ddp: Mapping[str, Any] | None = None,
          fsdp: Mapping[str, Any] | None = None, training_args: str | os.PathLike | None = None,
          accelerate_config: str | os.PathLike | None = None) -> Plan:
    """Plan the run of the live ``model`` under ``ds_config`` (a dict or a JSON path) on this machine.

    Outside DeepSpeed pass ``framework`` (``torch``, ``ddp``, ``fsdp``, ``fsdp2``) with ``precision``,
    ``optim`` (the Trainer's string), ``grad_accum``, ``ddp``/``fsdp`` settings (memfit's names or
    accelerate's ``fsdp_*`` keys) instead of a ``ds_config``; a model quantized by bitsandbytes is
    recognised from its weights. ``training_args`` (a TrainingArguments/SFTConfig JSON or YAML) and
    ``accelerate_config`` (an accelerate config YAML) are read as ``memfit plan`` reads them, under the
    same precedence (these arguments > the TrainingArguments > the accelerate config), and the same
    combinations are refused (with DeepSpeed, ``precision`` and ``grad_accum`` fill its "auto" values,
    as the Trainer's --bf16/--gradient_accumulation_steps do, and a written value they contradict is
    refused).

    ``deepspeed_version``: the DeepSpeed release the run uses (``"0.8.0"``, ``"0.6"``; default 0.19),
    planned with the allocation model of its line and its defaults (``core/stack/deepspeed.py``); a
    release memfit does not model is one ``MemfitError`` line naming those it does.

    GPUs and host RAM are read from the machine unless given (``gpus="2xrtx3090"``,
    ``cpu_ram="64GiB"``). Raises ``MemfitCheckError`` if a phase does not fit (unless
    ``raise_on_failure=False``) and emits a ``MemfitWarning`` per warning finding. Every argument
    is checked (type, range, finiteness): a bad one raises ``MemfitError`` naming it, and nothing
    but a ``MemfitError`` (``MemfitCheckError`` is one) leaves this function.
    """
    try:
        _check_arguments(ds_config=ds_config, gpus=gpus, nodes=nodes, cpu_ram=cpu_ram, seq_len=seq_len,
                         micro_batch=micro_batch, gradient_checkpointing=gradient_checkpointing,
                         model_parameters=model_parameters, deepspeed_version=deepspeed_version,
                         raise_on_failure=raise_on_failure, warn=warn, framework=framework, precision=precision,
                         optim=optim, grad_accum=grad_accum, ddp=ddp, fsdp=fsdp, training_args=training_args,
                         accelerate_config=accelerate_config)
        inputs = _resolved_inputs(ds_config, framework=framework, precision=precision, optim=optim,
                                  grad_accum=grad_accum, ddp=ddp, fsdp=fsdp, micro_batch=micro_batch, gpus=gpus,
                                  nodes=nodes, gradient_checkpointing=gradient_checkpointing,
                                  deepspeed_version=deepspeed_version, training_args=training_args,
                                  accelerate_config=accelerate_config, warn=warn)
        return _check(model, inputs, gpus=gpus, cpu_ram=cpu_ram, seq_len=seq_len,
                      model_parameters=model_parameters, deepspeed_version=deepspeed_version,
                      raise_on_failure=raise_on_failure, warn=warn)
    except (MemfitError, KeyboardInterrupt):
        raise
    except RecursionError:
        raise MemfitError("memfit.check: an argument is nested too deeply to read") from None
    except Exception as e:  # the contract: nothing but a MemfitError leaves (the cause stays chained)
        raise MemfitError(f"memfit.check could not plan this run ({type(e).__name__}: "
                          f"{str(e).splitlines()[0][:200] if str(e) else ''}); please report it") from e


def _user_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the first frame outside memfit (the user's line)."""
    import sys

    level, frame = 1, sys._getframe(1)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(root + os.sep):
        frame, level = frame.f_back, level + 1
    return level


def _warn(message: str) -> None:
    warnings.warn(message, MemfitWarning, stacklevel=_user_stacklevel())


def _resolved_inputs(ds_config, *, framework, precision, optim, grad_accum, ddp, fsdp, micro_batch, gpus, nodes,
                     gradient_checkpointing, deepspeed_version, training_args, accelerate_config, warn):
    """The arguments as ``ScenarioInputs``, checked and merged with the input files exactly as the CLI's
    (``check_inputs``, ``apply_input_files``): the same values refused, the same precedence."""
    from memfit.core.frameworks.resolve import apply_input_files
    from memfit.core.scenario.inputs import ScenarioInputs
    from memfit.core.scenario.validate import check_inputs

    given = dict(framework=framework, precision=precision, optim=optim, grad_accum=grad_accum,
                 ddp=dict(ddp) if ddp is not None else None, fsdp=dict(fsdp) if fsdp is not None else None,
                 micro_batch=micro_batch, gpus=gpus, nodes=nodes if nodes != 1 else None,
                 gradient_checkpointing=gradient_checkpointing, ds_version=deepspeed_version,
                 training_args=os.fspath(training_args) if training_args is not None else None,
                 accelerate_config=os.fspath(accelerate_config) if accelerate_config is not None else None)
    if isinstance(ds_config, (str, os.PathLike)):
        given["deepspeed"] = os.fspath(ds_config)
    elif ds_config is not None:
        given["deepspeed_inline"] = dict(ds_config)
    origins = {k: f"memfit.check({'ds_config' if k.startswith('deepspeed') else k}=...)" for k, v in given.items()
               if v is not None}
    inputs = apply_input_files(check_inputs(ScenarioInputs(origins=origins, **given)))
    if warn:
        for w in inputs.input_warnings:
            _warn(f"memfit: {w}")
    return inputs


def _whole(value: Any, name: str, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**31 - 1:
        raise MemfitError(f"memfit.check: {name} must be a whole number from 1 to 2**31-1, got {value!r:.60}")


def _check_arguments(*, ds_config: Any, gpus: Any, nodes: Any, cpu_ram: Any, seq_len: Any, micro_batch: Any,
                     gradient_checkpointing: Any, model_parameters: Any, deepspeed_version: Any,
                     raise_on_failure: Any, warn: Any, framework: Any, precision: Any = None, optim: Any = None,
                     grad_accum: Any = None, ddp: Any = None, fsdp: Any = None, training_args: Any = None,
                     accelerate_config: Any = None) -> None:
    from memfit.core.frameworks.pytorch import OPTIMIZERS, PRECISION_MODES
    if framework is not None and not isinstance(framework, str):
        raise MemfitError(f"memfit.check: framework must be a string, got {framework!r:.60}")
    for name, value in (("training_args", training_args), ("accelerate_config", accelerate_config)):
        if value is not None and (not isinstance(value, (str, os.PathLike)) or isinstance(value, bytes)
                                  or not os.fspath(value).strip()):
            raise MemfitError(f"memfit.check: {name} must be the path of a file, got {value!r:.60}")
    if ds_config is None and framework in (None, "deepspeed") and training_args is None and accelerate_config is None:
        raise MemfitError("memfit.check: give the DeepSpeed config, or framework='torch'/'ddp'/'fsdp'/'fsdp2'")
    if isinstance(ds_config, (str, os.PathLike)) and os.fspath(ds_config).lower().endswith((".yaml", ".yml")):
        raise MemfitError(f"memfit.check: ds_config {os.fspath(ds_config)!r:.80} is a YAML file; a DeepSpeed config "
                          "is JSON (an accelerate config goes in accelerate_config=, TrainingArguments in "
                          "training_args=)")
    if precision is not None and precision not in PRECISION_MODES:
        raise MemfitError(f"memfit.check: precision: invalid value {precision!r:.60}; valid: {', '.join(PRECISION_MODES)}")
    if optim is not None and optim not in OPTIMIZERS:
        raise MemfitError(f"memfit.check: optim: invalid value {optim!r:.60}; valid: {', '.join(OPTIMIZERS)}")
    _whole(grad_accum, "grad_accum", optional=True)
    for name, value in (("ddp", ddp), ("fsdp", fsdp)):
        if value is not None and not isinstance(value, Mapping):
            raise MemfitError(f"memfit.check: {name} must be a dict of settings, got {value!r:.60}")
    if framework is not None and framework not in ("deepspeed", "torch", "ddp", "fsdp", "fsdp2"):
        raise MemfitError(f"memfit.check: framework must be deepspeed, torch, ddp, fsdp or fsdp2, got {framework!r:.60}")
    if ds_config is not None and framework not in (None, "deepspeed"):
        raise MemfitError(f"memfit.check: a DeepSpeed config contradicts framework={framework!r}; drop one of them")
    if ds_config is None:
        pass
    elif not isinstance(ds_config, (Mapping, str, os.PathLike)) or isinstance(ds_config, bytes):
        raise MemfitError(f"memfit.check: ds_config must be a dict or the path of a DeepSpeed JSON, got "
                          f"{type(ds_config).__name__}")
    if isinstance(ds_config, str) and not ds_config.strip():
        raise MemfitError("memfit.check: ds_config is an empty path")
    if gpus is not None and (not isinstance(gpus, str) or not gpus.strip()):
        raise MemfitError(f"memfit.check: gpus must be a string such as '2xrtx3090', got {gpus!r:.60}")
    _whole(nodes, "nodes")
    if cpu_ram is not None and (isinstance(cpu_ram, bool) or not isinstance(cpu_ram, (str, int))):
        raise MemfitError(f"memfit.check: cpu_ram must be a size such as '64GiB' or a byte count, got {cpu_ram!r:.60}")
    _whole(seq_len, "seq_len")
    _whole(micro_batch, "micro_batch", optional=True)
    for name, value, optional in (("gradient_checkpointing", gradient_checkpointing, True),
                                  ("raise_on_failure", raise_on_failure, False), ("warn", warn, False)):
        if not (isinstance(value, bool) or (optional and value is None)):
            raise MemfitError(f"memfit.check: {name} must be True or False, got {value!r:.60}")
    if model_parameters not in ("trainable", "all"):
        raise MemfitError(f"memfit.check: model_parameters must be 'trainable' or 'all', got {model_parameters!r:.60}")
    if not isinstance(deepspeed_version, str) or not deepspeed_version.strip():
        raise MemfitError(f"memfit.check: deepspeed_version must be a DeepSpeed release such as '0.19.8' or '0.6', got "
                          f"{deepspeed_version!r:.60}")
    _ds_release(deepspeed_version)  # a release memfit does not model: one line naming those it does


def _ds_release(deepspeed_version: str) -> tuple[str, str]:
    """(release line, allocation model) of ``deepspeed_version`` (``core/stack/deepspeed.py``)."""
    from memfit.core.stack.deepspeed import allocation_line
    from memfit.core.stack.releases import release_line

    where = "memfit.check: deepspeed_version"
    release = release_line("deepspeed", deepspeed_version, where=where)
    if release is None:
        raise MemfitError(f"{where}: give the DeepSpeed release the run uses (the default is 0.19), not "
                          f"{deepspeed_version!r}")
    return release, allocation_line(release, where=where)


def _check(model: Any, inputs, *, gpus: str | None, cpu_ram: str | int | None, seq_len: int, model_parameters: str,
           deepspeed_version: str, raise_on_failure: bool, warn: bool) -> Plan:
    import torch

    from memfit.core.dsconfig import (AutoContext, parse_deepspeed_config, read_deepspeed_json, resolve_auto,
                                      trainer_defaults)
    from memfit.core.frameworks.resolve import resolve_framework_settings
    from memfit.core.hardware import Hardware, parse_gpus, parse_size
    from memfit.core.peft.parse import adapter_config_spec
    from memfit.core.peft.spec import PeftSpec
    from memfit.core.plan import make_plan
    from memfit.core.scenario.types import LoadSettings, Scenario, TrainSettings

    shape = model_shape_of(model)
    gpus = inputs.gpus if inputs.gpus is not None else gpus
    if gpus is not None:
        count, gpu = parse_gpus(gpus)
    else:
        found = _gpus()
        if found is None:
            raise MemfitError("no CUDA device visible: pass gpus='2xrtx3090' (or another card) to plan for one")
        count, gpu = found
    ram = parse_size(cpu_ram, what="cpu_ram") if cpu_ram is not None else _host_ram_bytes()
    hw = Hardware(gpu=gpu, gpus_per_node=count, nodes=inputs.nodes or 1, cpu_ram_bytes=ram)
    has_ds = inputs.deepspeed is not None or inputs.deepspeed_inline is not None
    framework = inputs.framework or ("deepspeed" if has_ds else None)
    micro_batch, precision = inputs.micro_batch, inputs.precision
    if framework == "deepspeed":  # the same refusals as the CLI (torch-only settings under DeepSpeed)
        resolve_framework_settings(inputs, hw, has_deepspeed_json=has_ds)
        if precision is not None and precision not in ("fp16", "bf16", "fp32"):
            raise MemfitError(f"memfit.check: precision: invalid value {precision!r} with DeepSpeed; valid: fp16, bf16, "
                              "fp32 (amp_* are the torch/DDP/FSDP precision modes)")
    if inputs.deepspeed is not None:
        raw = read_deepspeed_json(inputs.deepspeed)
    elif inputs.deepspeed_inline is not None:
        raw = inputs.deepspeed_inline
    else:  # outside DeepSpeed: a stage-0 stub carrying the micro batch
        raw = {"train_micro_batch_size_per_gpu": micro_batch or 1, "zero_optimization": {"stage": 0}}
    fills, sources = trainer_defaults(raw, precision="bf16" if gpu.bf16 else "fp16",
                                      precision_why=f"the GPU ({gpu.name}) {'supports' if gpu.bf16 else 'has no'} bf16")
    if inputs.grad_accum is not None and framework == "deepspeed":
        fills["gradient_accumulation_steps"] = inputs.grad_accum
        sources["gradient_accumulation_steps"] = inputs.origins.get("grad_accum", "grad_accum=")
    elif isinstance(raw.get("gradient_accumulation_steps"), str):
        fills["gradient_accumulation_steps"] = 1
        sources["gradient_accumulation_steps"] = "transformers' TrainingArguments default"
    if precision is not None and framework == "deepspeed":
        fills["precision"], sources["precision"] = precision, inputs.origins.get("precision", "precision=")
    if micro_batch is None and isinstance(raw.get("train_micro_batch_size_per_gpu"), str):
        fills["micro_batch_size"], sources["micro_batch_size"] = 1, "memfit's default (pass micro_batch=)"
    elif micro_batch is not None:
        fills["micro_batch_size"], sources["micro_batch_size"] = micro_batch, inputs.origins.get("micro_batch", "micro_batch=")
    ctx = AutoContext(world_size=hw.world_size, hidden_size=shape.arch.hidden_size if shape.arch.hidden_size > 1 else None,
                      sources=sources, **fills)
    ds, ds_json = parse_deepspeed_config(raw, context=ctx), resolve_auto(raw, ctx)
    if warn:
        for w in ds.warnings:
            _warn(f"memfit: {w}")
    from memfit.core.stack.deepspeed import apply_release_defaults
    from memfit.core.stack.resolve import resolve_stack

    _, allocation = _ds_release(deepspeed_version)
    stack = resolve_stack(inputs, framework=framework or "deepspeed")
    if framework in (None, "deepspeed"):  # the release's own defaults (offload pin_memory), said
        ds, ds_notes = apply_release_defaults(ds, raw, stack)
        if warn:
            for n in ds_notes:
                _warn(f"memfit: {n}")
    gradient_checkpointing = inputs.gradient_checkpointing
    dtypes = [p.dtype for p in model.parameters()]
    load_dtype = _DTYPES.get(str(max(set(dtypes), key=dtypes.count)), "fp32") if dtypes else "fp32"
    zero_init = any(hasattr(p, "ds_id") for p in model.parameters())
    if gradient_checkpointing is None:
        gradient_checkpointing = bool(getattr(model, "is_gradient_checkpointing", False))
    peft_cfg = getattr(model, "peft_config", {}).get("default", None)
    peft_type = getattr(peft_cfg, "peft_type", None)
    method = {"LORA": "lora", "PREFIX_TUNING": "prefix", "PROMPT_TUNING": "prompt"}.get(getattr(peft_type, "value", ""), "freeze")
    if all(p.trainable for p in shape.params):
        method = "full"
    peft_spec = PeftSpec(method=method)
    if method != "freeze" and method != "full":
        # the adapter's own settings (LoRA rank, prefix tokens), which size its activations, read as
        # adapter_config.json holds them: a live LoraConfig keeps target_modules as a set
        # (peft/tuners/lora/config.py __post_init__), which PeftConfigMixin.save_pretrained writes as a
        # list (peft/config.py, peft 0.21); sorted here, so the spec does not depend on set order
        raw_cfg = {k: sorted(v) if isinstance(v, (set, frozenset)) else v for k, v in peft_cfg.to_dict().items()}
        try:
            peft_spec = adapter_config_spec(raw_cfg)
        except MemfitError as e:
            _warn(f"memfit: the adapter's settings could not be read ({e}); planning with memfit's {method} defaults")
    quantized = any(getattr(p, "quant_state", None) is not None or type(p).__name__ == "Int8Params"
                    for p in model.parameters())
    if quantized:  # the load dtype of the non-quantized params (a 4-bit weight reports its storage dtype)
        dtypes = [p.dtype for p in model.parameters() if getattr(p, "quant_state", None) is None
                  and type(p).__name__ != "Int8Params" and p.is_floating_point()]
        load_dtype = _DTYPES.get(str(max(set(dtypes), key=dtypes.count)), "fp32") if dtypes else "fp32"
        compute = next((_DTYPES.get(str(getattr(m, "compute_dtype", None))) for m in _bnb_modules(model)), None)
        if load_dtype == "fp32" and compute:  # prepare_model_for_kbit_training upcast them: the model was
            load_dtype = compute               # loaded in the compute dtype, as with torch_dtype=compute dtype
    sc = Scenario(name=f"{shape.name} (live model)", model_ref=shape.name, model=shape, peft=peft_spec,
                  deepspeed=ds, deepspeed_json=ds_json, hardware=hw,
                  load=LoadSettings(dtype=load_dtype, zero_init=zero_init),
                  train=TrainSettings(seq_len=seq_len, micro_batch=micro_batch or ds.train_micro_batch_size_per_gpu,
                                      gradient_checkpointing=gradient_checkpointing, model_parameters=model_parameters),
                  ds_version=allocation, stack=stack, accelerator=inputs.accelerator or "cuda",
                  framework=framework or "deepspeed")
    if framework not in (None, "deepspeed"):
        sc = _framework_scenario(sc, model, inputs)
    del torch
    plan = make_plan(sc)
    if warn:
        for f in plan.findings:
            if f.severity in ("warning", "error"):
                _warn(f"memfit: {f.message}")
    from memfit.core.figures import failure_figure_name, gpu_verdict_name, HOST_NODE

    v = plan.verdict
    devs = {"gpu": "GPU memory per rank", "cpu": "host RAM per node", "nvme": "NVMe"}
    if warn and v.level == "at_risk":
        r = max(v.risks, key=lambda r: r.needed_bytes / r.available_bytes)
        name = gpu_verdict_name(plan) if r.device == "gpu" else HOST_NODE  # the figure, named as everywhere
        _warn(f"memfit: this run is at risk: phase {r.phase} needs {r.needed_bytes / 2**30:.2f} GiB of "
              f"{devs[r.device]} ({name}) of {r.available_bytes / 2**30:.2f} GiB; fits needs at most "
              f"{r.limit_bytes / 2**30:.2f} GiB ({r.why})")
    if raise_on_failure and not v.fits:
        from memfit.render.summary import verdict_sentence  # the sentence every output uses, its figure named

        fail, worst = v.failures[0], v.worst
        worse = (f"; worst: phase {worst.phase}, {worst.needed_bytes / 2**30:.2f} GiB of {devs[worst.device]} "
                 f"({failure_figure_name(plan, worst)})" if worst is not None and worst is not fail else "")
        raise MemfitCheckError(
            f"memfit: this run will not fit: {verdict_sentence(plan).removeprefix('DOES NOT FIT: ').rstrip('.')}{worse}",
            plan)
    return plan


def _bnb_modules(model):
    """bitsandbytes' own quantized Linear modules (not peft's wrappers, whose ``weight`` is the base's)."""
    return [m for m in model.modules() if type(m).__module__.startswith("bitsandbytes")
            and type(getattr(m, "weight", None)).__name__ in ("Params4bit", "Int8Params")]


def _framework_scenario(sc, model, given):
    """The live model's scenario outside DeepSpeed; bitsandbytes settings read off its first quantized
    weight (``quant_state``: quant type, double quantization, storage dtype; ``compute_dtype`` of
    its ``Linear4bit``)."""
    from dataclasses import replace as _replace

    import torch

    from memfit.core.frameworks.resolve import resolve_framework_settings

    quant = None
    for mod in _bnb_modules(model):
        w = mod.weight
        qs = getattr(w, "quant_state", None)
        if qs is not None:
            quant = {"method": "4bit", "quant_type": qs.quant_type, "double_quant": bool(qs.nested),
                     "quant_storage": _DTYPES.get(str(w.dtype), "uint8"),
                     "compute_dtype": _DTYPES.get(str(getattr(mod, "compute_dtype", None)), "fp32"),
                     # prepare_model_for_kbit_training leaves every non-quantized float param in fp32
                     "prepare_kbit": all(p.dtype == torch.float32 for p in model.parameters()
                                         if getattr(p, "quant_state", None) is None and p.is_floating_point())}
            break
        if type(w).__name__ == "Int8Params":
            quant = {"method": "8bit"}
            break
    inputs = _replace(given, quantization=quant, peft_method=sc.peft.method)
    fw = resolve_framework_settings(inputs, sc.hardware, has_deepspeed_json=False)
    return _replace(sc, framework=fw.framework, torch=fw.torch, quant=fw.quant, ddp=fw.ddp, fsdp=fw.fsdp)


__all__ = ["check", "MemfitCheckError", "MemfitWarning", "model_shape_of"]

