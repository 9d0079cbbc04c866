"""Precision modes outside DeepSpeed: which dtype each parameter, gradient and optimizer state has,
and what ``torch.autocast`` adds.

- ``fp32``: everything fp32.
- ``amp_fp16``/``amp_bf16`` (Trainer ``fp16=True``/``bf16=True`` on an fp32 model; accelerate's
  ``mixed_precision``): trained params stay fp32 (so do their gradients and optimizer states);
  ``torch.autocast`` runs matmuls in 16 bits. Autocast casts each fp32 weight an op uses to 16
  bits (``aten/src/ATen/autocast_mode.cpp:cached_cast``): the copy of a weight that is a leaf
  requiring grad is cached for the rest of the autocast region; either way the copy is saved by
  autograd for the backward of the op whenever its input needs a gradient, so the 16-bit copies of
  the Linear weights live from their use in forward until their layer's backward. fp16 adds a
  ``GradScaler`` (``torch/amp/grad_scaler.py``: a 0-d fp32 scale and a 0-d int32 growth tracker
  created at the first ``scale()``); a trained fp16 param is refused there ("Attempting to unscale
  FP16 gradients").
- ``fp16``/``bf16`` (pure): the model is 16-bit (``from_pretrained(torch_dtype=...)`` or
  ``model.to(dtype)``), so are its gradients and, through ``torch.zeros_like(p)``, the optimizer's
  states; no fp32 master copy.

Frozen params keep the dtype they were loaded in. PEFT's own parameters are fp32 (peft 0.21
``get_peft_model(autocast_adapter_dtype=True)`` upcasts 16-bit adapters). Under bitsandbytes
quantization, ``prepare_model_for_kbit_training`` (peft ``utils/other.py``) upcasts every fp16/bf16
parameter that is not a ``Params4bit`` to fp32, one param at a time (``param.data =
param.data.to(torch.float32)``).
"""

from __future__ import annotations


from memfit.core.lean_dataclass import dataclass
from memfit.errors import MemfitError

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


@dataclass(frozen=True, slots=True, kw_only=True)
class PrecisionModel:
    """The training precision: its mode, the autocast dtype, whether a GradScaler runs, the pure 16-bit dtype."""

    mode: str
    autocast: str | None
    """16-bit dtype autocast casts to (``fp16``/``bf16``), None without autocast."""
    grad_scaler: bool
    pure: str | None
    """The model's dtype in the pure 16-bit modes."""

    @property
    def compute_bytes(self) -> int:
        """Element size of the activations (matmul outputs) under this mode."""
        if self.autocast or self.pure:
            return 2
        return 4


def resolve_precision(mode: str) -> PrecisionModel:
    if mode == "fp32":
        return PrecisionModel(mode=mode, autocast=None, grad_scaler=False, pure=None)
    if mode in ("amp_fp16", "amp_bf16"):
        return PrecisionModel(mode=mode, autocast=mode[4:], grad_scaler=mode == "amp_fp16", pure=None)
    if mode in ("fp16", "bf16"):
        return PrecisionModel(mode=mode, autocast=None, grad_scaler=False, pure=mode)
    raise MemfitError(f"unknown precision mode {mode!r}")


def base_param_dtype(pm: PrecisionModel, *, load_dtype: str, trainable: bool, kbit_upcast: bool) -> str:
    """The dtype a non-PEFT, non-quantized parameter trains in (see the module docstring)."""
    if kbit_upcast:
        return "fp32"
    if pm.pure:
        return pm.pure
    if not trainable:
        return load_dtype
    if load_dtype != "fp32":
        if pm.mode == "amp_fp16":
            raise MemfitError(
                f"precision amp_fp16 with trained parameters loaded in {load_dtype}: the GradScaler refuses them "
                f"(torch/amp/grad_scaler.py: 'Attempting to unscale FP16 gradients'); load the model in fp32 "
                f"(load dtype fp32) or use precision {load_dtype} (pure 16-bit)")
        return load_dtype  # the Trainer trains them as they are: pure 16-bit for these params
    return "fp32"
