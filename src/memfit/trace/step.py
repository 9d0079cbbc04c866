"""Trace one training step (forward, loss, backward) of the real model code on fake tensors.

``trace_training_step`` builds the model from its config.json (meta device, then fake storage on
the CPU device: fake "cuda" tensors fail on indexing ops in CPU builds of torch, and sizes are the
same), applies the PEFT method with peft, and runs the step under ``FakeTensorMode`` with an
``AllocationTracker`` on top. ``trace_model`` runs the same bookkeeping on a model you built,
fake or real (the tests run it on real CPU tensors and compare).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from time import perf_counter
from typing import Any

import torch

from memfit.core.peft.spec import PeftSpec
from memfit.errors import MemfitError
from memfit.trace import tracker as tk
from memfit.trace.cuda_kernels import autocast_region, cuda_autocast_policy, cuda_like_kernels
from memfit.trace.model_build import (
    TORCH_DTYPES,
    apply_peft,
    build_meta_model,
    materialize_fake,
)
from memfit.trace.record import ParamRecord, StepRecord, trace_result
from memfit.trace.results import TraceOptions, TraceResult, TraceTimings
from memfit.trace.deepspeed.zero3_linear import zero3_linear_patched
from memfit.trace.graph_release import graph_nodes, release_nodes
from memfit.trace.memory_watch import MemoryWatch

ProgressCallback = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: stage is ``build``, ``forward`` or ``backward``."""


def trace_training_step(
    config: Mapping[str, Any],
    peft: PeftSpec | None = None,
    options: TraceOptions | None = None,
    *,
    progress: ProgressCallback | None = None,
    reuse_layers: bool | None = None,
) -> TraceResult:
    """Trace forward + loss + backward of the model ``config`` (a config.json mapping) trained with
    ``peft`` (default: full fine-tuning), on ``options.micro_batch`` x ``options.seq_len`` tokens.

    ``reuse_layers``: trace a deep model's identical layers once (``memfit.trace.layer_reuse``; None: from
    ``layer_reuse.MIN_LAYERS`` layers, True: from stacks of 7, False: never); ``TraceResult.layer_reuse`` says which
    was done and why."""
    peft = peft or PeftSpec()
    options = options or TraceOptions()
    with quiet_libraries():
        return _trace_training_step(config, peft, options, progress, reuse_layers)


def _trace_training_step(
    config: Mapping[str, Any], peft: PeftSpec, options: TraceOptions, progress: ProgressCallback | None,
    reuse_layers: bool | None = None,
) -> TraceResult:
    from dataclasses import replace

    from torch._subclasses.fake_tensor import FakeTensorMode

    from memfit.trace import layer_reuse

    start = perf_counter()
    if progress:
        progress("build", 0, 1)
    config = _with_pad_token(config, options)
    model = build_meta_model(config, attention=options.attention, task=options.task)
    model = apply_peft(model, peft)
    if options.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpoint_kwargs(options))
    model.train()
    fake_mode = FakeTensorMode()

    def materialize() -> None:
        materialize_fake(model, fake_mode, TORCH_DTYPES[options.dtype])
        if options.adapter_dtype is not None and options.adapter_dtype != options.dtype:
            recast_adapters(model, fake_mode, TORCH_DTYPES[options.adapter_dtype])

    if reuse_layers is False:
        decision = layer_reuse.ReuseDecision((), "layer reuse off")
    else:
        decision = layer_reuse.decide(model, min_layers=layer_reuse.CHECK_LAYERS + 1 if reuse_layers
                                      else layer_reuse.MIN_LAYERS)
    reason = decision.reason
    if decision.stacks:
        def trace_cut() -> StepRecord:
            materialize()
            with fake_mode:
                inputs = task_inputs(model, options)
            if progress:
                progress("build", 1, 1)
            record = record_step(model, inputs, options, fake_mode=fake_mode, method=peft.method,
                                 build_s=perf_counter() - start, progress=progress)
            for p in model.parameters():
                p.grad = None
            return record

        try:
            record = layer_reuse.reused_record(model, decision.stacks, trace_cut, model_tables(model))
            layers = " and ".join(f"{s.layers} layers of {s.prefix}" for s in decision.stacks)
            return replace(trace_result(record), layer_reuse=(
                f"{layers} written out from traces of the first {layer_reuse.TEMPLATE_LAYERS} and "
                f"{layer_reuse.CHECK_LAYERS} (equal record for record at {layer_reuse.CHECK_LAYERS})"))
        except (layer_reuse.NotReusable, MemfitError) as exc:
            reason = str(exc)
    materialize()
    with fake_mode:
        inputs = task_inputs(model, options)
    build_s = perf_counter() - start
    if progress:
        progress("build", 1, 1)
    result = trace_model(
        model, inputs, options, fake_mode=fake_mode, method=peft.method, build_s=build_s, progress=progress
    )
    return replace(result, layer_reuse=f"full trace ({reason})")


def model_tables(model: torch.nn.Module) -> tuple[list[str], list[str], list[int], list[tuple[int, ...]]]:
    """Module names, param names, param sizes and each module's direct params (indices), as
    ``record_step`` numbers them."""
    named = list(model.named_modules())
    param_index: dict[int, int] = {}
    param_names, numels = [], []
    for name, p in model.named_parameters():
        param_index[id(p)] = len(param_names)
        param_names.append(name)
        numels.append(p.numel())
    module_params = [tuple(param_index[id(p)] for p in m.parameters(recurse=False) if id(p) in param_index)
                     for _, m in named]
    return [n for n, _ in named], param_names, numels, module_params


def recast_adapters(model: torch.nn.Module, fake_mode: Any, dtype: torch.dtype) -> None:
    """The PEFT-created floating params (``memfit.core.peft.adapter_params``) as fresh fake tensors in
    ``dtype``, in place."""
    from memfit.core.peft.adapter_params import is_adapter_param

    with fake_mode:
        for name, module in model.named_modules():
            for pname, param in list(module._parameters.items()):
                if param is not None and param.is_floating_point() and is_adapter_param(f"{name}.{pname}"):
                    empty = torch.empty(param.shape, dtype=dtype, device="cpu")
                    module._parameters[pname] = torch.nn.Parameter(empty, requires_grad=param.requires_grad)


def checkpoint_kwargs(options: TraceOptions) -> dict[str, Any]:
    """transformers' default (non-reentrant ``torch.utils.checkpoint``); under CUDA's autocast policy
    its recompute gets the policy too (torch function modes are not active while backward runs the
    recompute: ``context_fn`` pushes it there)."""
    if options.autocast is None or options.kernels != "cuda":
        return {"use_reentrant": False}
    return {"use_reentrant": False,
            "context_fn": lambda: (contextlib.nullcontext(), cuda_autocast_policy(True))}


def causal_lm_inputs(options: TraceOptions) -> dict[str, torch.Tensor]:
    """``input_ids`` and ``labels`` (no attention mask: unpadded sequences, causal attention)."""
    ids = torch.zeros(options.micro_batch, options.seq_len, dtype=torch.long)
    return {"input_ids": ids, "labels": torch.zeros_like(ids)}


def task_inputs(model: torch.nn.Module, options: TraceOptions) -> dict[str, torch.Tensor]:
    """The batch the model's head trains on: ``input_ids`` (b, seq_len) and its labels.

    Language models: ``labels`` (b, s), the decoder's (b, target_len) for encoder-decoders (the
    model shifts them right into ``decoder_input_ids``); sequence classification: one label per
    sequence; token classification: one per token; question answering: ``start_positions`` and
    ``end_positions`` per sequence. No attention mask (unpadded rows, as ``causal_lm_inputs``).
    """
    from memfit.core.families.heads import task_of_class

    b = options.micro_batch
    ids = torch.zeros(b, options.seq_len, dtype=torch.long)
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft wraps the class
    task = options.task or task_of_class(type(inner).__name__) or "causal-lm"
    config = getattr(model, "config", None)
    if task == "seq2seq-lm" or (getattr(config, "is_encoder_decoder", False) and task == "causal-lm"):
        target = options.target_len or options.seq_len
        return {"input_ids": ids, "labels": torch.zeros(b, target, dtype=torch.long)}
    if task == "sequence-classification":
        return {"input_ids": ids, "labels": torch.zeros(b, dtype=torch.long)}
    if task == "question-answering":
        zeros = torch.zeros(b, dtype=torch.long)
        return {"input_ids": ids, "start_positions": zeros, "end_positions": zeros.clone()}
    return {"input_ids": ids, "labels": torch.zeros_like(ids)}


def _with_pad_token(config: Mapping[str, Any], options: TraceOptions) -> Mapping[str, Any]:
    """Decoder sequence classifiers find each row's last token through ``pad_token_id`` and refuse
    batches > 1 without one (GenericForSequenceClassification); the traced rows hold no padding, so
    any id gives the same tensors: 0 where the config has none."""
    if options.task == "sequence-classification" and config.get("pad_token_id") is None:
        return {**config, "pad_token_id": 0}
    return config


def trace_model(
    model: torch.nn.Module,
    inputs: Mapping[str, torch.Tensor],
    options: TraceOptions,
    *,
    fake_mode: Any = None,
    method: str = "full",
    build_s: float = 0.0,
    progress: ProgressCallback | None = None,
) -> TraceResult:
    """Run ``model(**inputs)``, take ``.loss`` and backpropagate it, tracking every allocation.

    ``fake_mode`` is the ``FakeTensorMode`` the model's tensors belong to, or None for real tensors.
    """
    return trace_result(record_step(model, inputs, options, fake_mode=fake_mode, method=method, build_s=build_s,
                                    progress=progress))


def record_step(
    model: torch.nn.Module,
    inputs: Mapping[str, torch.Tensor],
    options: TraceOptions,
    *,
    fake_mode: Any = None,
    method: str = "full",
    build_s: float = 0.0,
    progress: ProgressCallback | None = None,
) -> StepRecord:
    """``trace_model``'s step, as the tracker's raw log (``trace_result`` turns it into a ``TraceResult``)."""
    tracker = tk.AllocationTracker(granularity_bytes=options.granularity_bytes)
    tracker.autocast_dtype = TORCH_DTYPES[options.autocast] if options.autocast else None
    named = list(model.named_modules())
    names = [n for n, _ in named]
    params: list[torch.nn.Parameter] = []
    param_index: dict[int, int] = {}
    param_names: list[str] = []
    for name, p in model.named_parameters():
        param_index[id(p)] = len(params)
        params.append(p)
        param_names.append(name)
    module_params: list[tuple[int, ...]] = []
    owner = [tk.NO_MODULE] * len(params)
    for idx, (_, module) in enumerate(named):
        direct = tuple(param_index[id(p)] for p in module.parameters(recurse=False) if id(p) in param_index)
        module_params.append(direct)
        for i in direct:
            if owner[i] == tk.NO_MODULE:
                owner[i] = idx
    for i, p in enumerate(params):
        cat = tk.PARAM_TRAINABLE if p.requires_grad else tk.PARAM_FROZEN
        tracker.track(p.untyped_storage(), cat, owner[i])
    for idx, (_, module) in enumerate(named):
        for b in module.buffers(recurse=False):
            tracker.track(b.untyped_storage(), tk.BUFFER, idx)
        for value in vars(module).values():
            for t in _tensor_attribute(value):
                tracker.track(t.untyped_storage(), tk.BUFFER, idx)
    for t in inputs.values():
        tracker.track(t.untyped_storage(), tk.INPUT, tk.NO_MODULE)

    counter = _Progress(progress, len(named), watch=MemoryWatch(len(named)))
    handles = []
    for idx, (_, module) in enumerate(named):
        handles.append(module.register_forward_pre_hook(_pre_hook(tracker, idx)))
        handles.append(module.register_forward_hook(_post_hook(tracker, idx, counter), always_call=True))
    for i, p in enumerate(params):
        if p.requires_grad:
            handles.append(p.register_post_accumulate_grad_hook(_grad_hook(tracker, i, owner[i], counter)))

    mode = fake_mode if fake_mode is not None else contextlib.nullcontext()
    timings = [0.0, 0.0]
    try:
        with (
            zero3_linear_patched(options.zero3_linear),
            unpacked_sequences(fake_mode is not None),
            cuda_like_kernels(options.kernels == "cuda"),
            mode,
            tracker,
            tk.NodeTagger(tracker),
            cuda_autocast_policy(options.autocast is not None and options.kernels == "cuda"),
            torch.autograd.graph.saved_tensors_hooks(tracker.pack, tracker.unpack),
        ):
            t0 = perf_counter()
            counter.stage("forward")
            tracker.set_phase(0)
            with autocast_region(TORCH_DTYPES[options.autocast] if options.autocast else None):
                outputs = _run(model, inputs, method, options)
                loss = outputs.loss if hasattr(outputs, "loss") else outputs[0]
            _mark_outputs(tracker, outputs)
            if not options.keep_outputs:
                outputs = None  # the loop keeps only the loss
            for key, _, cat, _ in tracker.live_items():
                if cat == tk.TEMPORARY:
                    tracker.recategorize_key(key, tk.HELD)
            tracker.event("end_forward")
            end_forward_at = len(tracker.log)
            t1 = perf_counter()
            counter.stage("backward")
            tracker.set_phase(1)
            loss.backward()
            tracker.event("end_backward")
            timings = [t1 - t0, perf_counter() - t1]
    finally:
        for h in handles:
            h.remove()

    end_backward_at = len(tracker.log)
    base = getattr(model, "base_model", None)
    inner = getattr(base, "model", None) if base is not None else None
    record = StepRecord(
        model_type=str(getattr(getattr(model, "config", None), "model_type", "")),
        architecture=type(model).__name__ + (f"({type(inner).__name__})" if inner is not None else ""),
        method=method, options=options, names=tuple(names),
        params=tuple(ParamRecord(name=n, numel=p.numel(), element_bytes=p.element_size(), trainable=p.requires_grad,
                                 rounded_bytes=round_param(p, options)) for n, p in zip(param_names, params)),
        module_params=tuple(module_params), log=tracker.log[:end_backward_at], events=tuple(tracker.events),
        marks=tuple(tracker.marks), end_forward_at=end_forward_at,
        timings=TraceTimings(build_s=build_s, forward_s=timings[0], backward_s=timings[1]))
    # the graph (loss, kept outputs, the node last run) freed one node at a time: recursively, a deep
    # model overflows the C stack (graph_release's docstring)
    nodes = graph_nodes([loss, *_tensors_in(outputs)])
    tracker._node = None
    loss = outputs = None
    release_nodes(nodes)
    return record


@contextlib.contextmanager
def quiet_libraries():
    """No output from transformers, peft or torch's fake-tensor logger while tracing (the library
    prints nothing; warnings that matter surface as ``MemfitError``)."""
    import logging
    import warnings

    loggers = [logging.getLogger(n) for n in ("torch._subclasses.fake_tensor", "transformers", "peft")]
    levels = [lg.level for lg in loggers]
    try:
        from transformers.utils import logging as hf_logging

        hf_level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
    except ImportError:
        hf_logging = None
    try:
        for lg in loggers:
            lg.setLevel(logging.CRITICAL)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
        if hf_logging is not None:
            hf_logging.set_verbosity(hf_level)


@contextlib.contextmanager
def unpacked_sequences(enabled: bool):
    """Tell transformers the batch holds one sequence per row, as the real run finds out.

    transformers (masking_utils ``find_packed_sequence_indices``) reads ``position_ids`` values to
    detect packed sequences; on fake tensors it cannot, assumes packing and builds an explicit
    causal mask the real run skips (sdpa then runs with ``attn_mask`` instead of ``is_causal``).
    The traced inputs are unpadded, unpacked rows, so the answer is known: none are packed.
    """
    try:
        from transformers import masking_utils
    except ImportError:
        masking_utils = None
    original = getattr(masking_utils, "find_packed_sequence_indices", None)
    if not enabled or original is None:
        yield
        return
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original


def _run(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor], method: str, options: TraceOptions) -> Any:
    """``model(**inputs)``; a failure of the model's own code under this configuration is the
    user's to know about (e.g. transformers drops peft's prefix cache under checkpointing)."""
    try:
        return model(**inputs)
    except MemfitError:  # the trace's own (memory_watch), already one line for the user
        raise
    except (RuntimeError, ValueError, TypeError, AttributeError, KeyError, IndexError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        hint = ""
        if method == "prefix" and options.gradient_checkpointing:
            hint = (" (transformers turns the cache off under gradient checkpointing, which drops the prefix"
                    " keys and values peft passes as past_key_values: prefix tuning cannot use checkpointing here)")
        raise MemfitError(
            f"the model's forward fails with {method} and gradient_checkpointing="
            f"{options.gradient_checkpointing}: {first}{hint}"
        ) from exc


def round_param(p: torch.Tensor, options: TraceOptions) -> int:
    return tk.round_up(p.untyped_storage().nbytes(), options.granularity_bytes)


# ------------------------------------------------------------------------------------ hooks
class _Progress:
    """Calls the progress callback at most ~50 times per stage."""

    def __init__(self, callback: ProgressCallback | None, total: int, watch: Callable[[], None] | None = None) -> None:
        self.callback = callback
        self.watch = watch
        self.total = max(total, 1)
        self.name = ""
        self.done = 0
        self._every = max(self.total // 50, 1)

    def stage(self, name: str) -> None:
        self.name, self.done = name, 0
        if self.callback:
            self.callback(name, 0, self.total)

    def step(self) -> None:
        self.done += 1
        if self.watch is not None and self.name == "forward":
            self.watch()
        if self.callback and self.done % self._every == 0:
            self.callback(self.name, min(self.done, self.total), self.total)


def _pre_hook(tracker: tk.AllocationTracker, idx: int):
    def hook(module, args):
        tracker.stack.append(idx)
        tracker.event("fwd_pre", idx)

    return hook


def _post_hook(tracker: tk.AllocationTracker, idx: int, counter: _Progress):
    def hook(module, args, output):
        if tracker.stack:
            # outputs made by code the TorchFunctionMode does not see (autograd.Function.apply)
            for t in _tensors_in(output):
                tk.tag_node(t, idx)
        tracker.event("fwd_post", idx)
        if tracker.stack and tracker.stack[-1] == idx:
            tracker.stack.pop()
        if tracker.phase == 0:
            counter.step()

    return hook


def _grad_hook(tracker: tk.AllocationTracker, index: int, owner: int, counter: _Progress):
    def hook(param):
        if param.grad is not None:
            tracker.recategorize(param.grad.untyped_storage(), tk.GRADIENT, module=owner)
        tracker.event("grad", owner, index)
        counter.step()

    return hook


def _mark_outputs(tracker: tk.AllocationTracker, outputs: Any) -> None:
    """Temporaries reachable from the model's return value become outputs (no reference kept)."""
    for t in _tensors_in(outputs):
        tracker.recategorize(t.untyped_storage(), tk.OUTPUT, only_from=frozenset({tk.TEMPORARY}))


def _tensor_attribute(value: Any) -> list[torch.Tensor]:
    """Plain tensors a module holds as attributes (peft's ``prompt_tokens`` dict), not params."""
    if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
        return [value]
    if isinstance(value, dict):
        return [v for v in value.values() if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter)]
    return []


def _tensors_in(obj: Any, depth: int = 0) -> list[torch.Tensor]:
    """Tensors reachable from a model output: ModelOutput fields, tuples, caches' layers."""
    if depth > 6 or obj is None:
        return []
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, Mapping):
        return [t for v in obj.values() for t in _tensors_in(v, depth + 1)]
    if isinstance(obj, (tuple, list)):
        return [t for v in obj for t in _tensors_in(v, depth + 1)]
    layers = getattr(obj, "layers", None)  # transformers Cache
    if isinstance(layers, (list, tuple)):
        found = []
        for layer in layers:
            for attr in ("keys", "values"):
                found += _tensors_in(getattr(layer, attr, None), depth + 1)
        return found
    return []
