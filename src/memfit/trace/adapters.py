"""What one adapted layer keeps for backward: peft's own layer run on real CPU tensors and traced.

``trace_adapted_layer`` wraps a single ``nn.Linear`` (or a transformers ``Conv1D``) named ``proj`` with
the real peft tuner (``get_peft_model`` with ``target_modules=["proj"]``), feeds it an input of
``(1, tokens, in)`` that requires a gradient (as a layer input does inside a model whose earlier
layers train or whose embedding output requires grad), and runs forward + backward under
``memfit.trace.step.trace_model`` (the ``AllocationTracker``; CUDA kernel choices for dropout and
attention, ``memfit.trace.cuda_kernels``). The result is what the memfit adapter activation model
(``memfit.core.activations.adapters``) is compared with: the bytes alive at the end of the forward
beside the parameters, buffers and the input itself, and whether the input's own storage is saved.

The dtypes are those of the frameworks memfit plans: the base in ``dtype``; the adapter in
``adapter_dtype`` (fp32: peft's ``autocast_adapter_dtype`` upcast of a 16-bit model, the torch loop;
the base's dtype: DeepSpeed casts the whole module); ``autocast``: the forward under
``torch.autocast`` in that dtype (torch AMP).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from memfit.trace.model_build import TORCH_DTYPES


@dataclass(frozen=True, slots=True)
class LayerTrace:
    """One adapted layer's forward, traced."""

    saved_bytes: int
    """Alive at the end of the forward beside parameters, buffers, the input and the loss: what the
    layer keeps for backward (saved tensors and anything else autograd still holds)."""
    keeps_input: bool
    """The input's own storage is among the saved tensors (it is shared with whatever else saves it)."""
    forward_peak_bytes: int
    """Peak of the activation side during the forward, above the input."""


class _Holder(torch.nn.Module):
    def __init__(self, layer: torch.nn.Module) -> None:
        super().__init__()
        self.proj = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


@dataclass
class _Loss:
    loss: torch.Tensor


class _Step(torch.nn.Module):
    """``model(x=...)`` with a ``.loss``: the layer's output summed (``sum`` saves nothing)."""

    def __init__(self, model: torch.nn.Module, autocast: str | None) -> None:
        super().__init__()
        self.model = model
        self.autocast = autocast

    def forward(self, x: torch.Tensor):  # noqa: ANN201
        ctx = (torch.autocast("cpu", dtype=TORCH_DTYPES[self.autocast]) if self.autocast
               else contextlib.nullcontext())
        with ctx:
            out = self.model(x)
        return _Loss(out.sum())


def quantized_linear(in_features: int, out_features: int, *, method: str, dtype: str, compute_dtype: str = "bf16",
                     double_quant: bool = True, bias: bool = False) -> torch.nn.Module:
    """A bitsandbytes ``Linear4bit`` (NF4) or ``Linear8bitLt`` quantized on the CPU from a ``dtype`` weight,
    as ``replace_with_bnb_linear`` + loading leave it."""
    import bitsandbytes as bnb

    weight = torch.randn(out_features, in_features, dtype=TORCH_DTYPES[dtype])
    if method == "4bit":
        layer = bnb.nn.Linear4bit(in_features, out_features, bias=bias, compute_dtype=TORCH_DTYPES[compute_dtype],
                                  quant_type="nf4", compress_statistics=double_quant)
        layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, quant_type="nf4", compress_statistics=double_quant)
    else:
        layer = bnb.nn.Linear8bitLt(in_features, out_features, bias=bias, has_fp16_weights=False)
        layer.weight = bnb.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False)
    layer = layer.to("cpu")
    if bias:
        layer.bias = torch.nn.Parameter(torch.zeros(out_features, dtype=TORCH_DTYPES[dtype]), requires_grad=False)
    return layer


def build_adapted_layer(peft_type: str, config: Mapping[str, Any], *, in_features: int, out_features: int,
                        dtype: str, adapter_dtype: str, bias: bool = False, conv1d: bool = False,
                        quantization: str | None = None, compute_dtype: str = "bf16", seed: int = 0) -> torch.nn.Module:
    """One layer named ``proj`` in ``dtype``, adapted by peft with ``config``; adapters in ``adapter_dtype``.
    ``quantization``: the base is a bitsandbytes ``4bit`` or ``8bit`` layer (peft then picks its bnb
    layer classes, as for a model loaded with ``load_in_4bit``/``load_in_8bit``)."""
    import peft

    torch.manual_seed(seed)
    if quantization is not None:
        base = quantized_linear(in_features, out_features, method=quantization, dtype=dtype, compute_dtype=compute_dtype,
                                bias=bias)
    elif conv1d:
        from transformers.pytorch_utils import Conv1D

        base = Conv1D(out_features, in_features)
    else:
        base = torch.nn.Linear(in_features, out_features, bias=bias)
    holder = _Holder(base) if quantization is not None else _Holder(base).to(TORCH_DTYPES[dtype])
    if quantization is not None:  # what transformers sets on a quantized model; peft's dispatchers read it
        holder.is_loaded_in_4bit = quantization == "4bit"
        holder.is_loaded_in_8bit = quantization == "8bit"
    cfg = peft.PEFT_TYPE_TO_CONFIG_MAPPING[peft.PeftType(peft_type)](target_modules=["proj"], **dict(config))
    model = peft.get_peft_model(holder, cfg)
    if adapter_dtype != "fp32":  # DeepSpeed casts every parameter, adapters included, and keeps fp32 buffers
        for p in model.parameters():  # (engine.py _cast_module_mixed_precision: "Cast params only")
            p.data = p.data.to(TORCH_DTYPES[adapter_dtype])
    model.train()
    return model


def trace_adapted_layer(peft_type: str, config: Mapping[str, Any], *, in_features: int, out_features: int,
                        tokens: int, dtype: str = "bf16", adapter_dtype: str = "fp32", autocast: str | None = None,
                        bias: bool = False, conv1d: bool = False, model: torch.nn.Module | None = None) -> LayerTrace:
    """Trace one adapted layer (module doc); ``model``: an adapted layer built already (a bitsandbytes one)."""
    from memfit.trace.results import TraceOptions
    from memfit.trace.step import quiet_libraries, trace_model

    with quiet_libraries():
        if model is None:
            model = build_adapted_layer(peft_type, config, in_features=in_features, out_features=out_features,
                                        dtype=dtype, adapter_dtype=adapter_dtype, bias=bias, conv1d=conv1d)
        x = torch.randn(1, tokens, in_features, dtype=TORCH_DTYPES[dtype], requires_grad=True)
        step = _Step(model, autocast)
        kept = _input_saved(step, x)
        options = TraceOptions(seq_len=tokens, micro_batch=1, dtype=dtype, granularity_bytes=1, keep_outputs=False)
        result = trace_model(step, {"x": x}, options, method=peft_type.lower())
    end = result.end_of_forward
    loss = TORCH_DTYPES[autocast or dtype].itemsize if autocast else TORCH_DTYPES[dtype].itemsize
    saved = end.saved_bytes + end.held_bytes + end.temporary_bytes + max(end.output_bytes - loss, 0)
    peak = result.forward.breakdown
    forward_peak = peak.saved_bytes + peak.held_bytes + peak.temporary_bytes + peak.output_bytes
    return LayerTrace(saved_bytes=saved, keeps_input=kept, forward_peak_bytes=forward_peak)


def _input_saved(step: torch.nn.Module, x: torch.Tensor) -> bool:
    """Whether autograd saves ``x``'s own storage in the forward (a separate run: the tracker's pack hook
    counts saved temporaries, not the input)."""
    seen: list[int] = []
    ptr = x.untyped_storage().data_ptr()

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.layout == torch.strided and t.untyped_storage().data_ptr() == ptr:  # (SHiRA saves a sparse tensor)
            seen.append(1)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step(x)
    return bool(seen)
