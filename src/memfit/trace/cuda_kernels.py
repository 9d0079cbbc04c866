"""Trace the memory of CUDA kernel choices while running on the CPU device.

Two ops pick a different kernel on a GPU than on the CPU, with different saved tensors:

- dropout: ``torch.nn.functional.dropout`` in training calls the fused ``native_dropout`` only for
  CUDA inputs (aten/src/ATen/native/Dropout.cpp ``is_fused_kernel_acceptable``), which saves a bool
  mask (1 byte per element); on the CPU it multiplies by a noise tensor of the input's dtype and
  saves that (2 bytes per element in fp16). Here training-mode dropout calls ``native_dropout``.
- ``scaled_dot_product_attention``: CUDA picks flash, memory-efficient or math
  (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp ``select_sdp_backend``, in that order on an
  sm80+ GPU); the CPU picks its own flash kernel or a math fallback that upcasts 16-bit inputs to
  fp32 and materializes the score matrix (for masks it cannot take, different value widths,
  broadcast key heads). Here sdpa calls the CUDA ops themselves, whose fake (meta) kernels run on
  CPU fake tensors with the CUDA autograd formulas (tools/autograd/derivatives.yaml):

  * ``_scaled_dot_product_flash_attention`` when there is no mask, the inputs are fp16/bf16, q, k
    and v have one head width <= 256 (a multiple of 8) and key heads divide query heads: it saves
    q, k, v, the output, an fp32 logsumexp ``(b, heads, s_q)`` and the RNG state;
  * ``_scaled_dot_product_efficient_attention`` otherwise when q/k head widths are equal multiples
    of 8 (4 for fp32) and key heads equal query heads: it saves the same plus the mask (``attn_bias``)
    and a logsumexp padded to a multiple of 32 queries;
  * the math kernel in the remaining cases (key heads that broadcast, unaligned widths), as CUDA
    runs it (``_scaled_dot_product_attention_math`` in aten/src/ATen/native/transformers/attention.cpp):
    16-bit inputs upcast to fp32, q and k scaled by sqrt(scale) each, their product plus the mask, a
    softmax and dropout in fp32, then times v, cast back (see ``_math``).

  Attention dropout runs inside both fused kernels (a Philox seed, no mask), as on the GPU.

- ``layer_norm``: CUDA's kernel keeps the mean and rstd in fp32 for 16-bit inputs (``acc_type``), the
  CPU's in the input dtype: here a ``native_layer_norm`` whose saved statistics are fp32 (``_CudaLayerNorm``).
- ``torch.autocast``: CUDA's op lists are not the CPU's (aten/src/ATen/autocast_mode.cpp, torch
  2.13: ``AT_FORALL_FP32``, ``AT_FORALL_FP32_SET_OPT_DTYPE`` and ``AT_FORALL_LOWER_PRECISION_FP`` for
  CUDA; the ``KERNEL_CPU`` lines for the CPU). ``autocast_region`` runs CPU autocast (the same matmul
  list and the same cast cache of fp32 leaf weights, ``cached_cast``) and adds what CUDA does on
  top, as a ``TorchFunctionMode`` (``cuda_autocast_policy``) active only where CPU autocast is enabled (so a model's own
  ``autocast(enabled=False)`` region and a checkpointed block's recompute behave as on the GPU):

  * fp32 ops (``layer_norm``, ``pow``, ``rsqrt``, ``exp``, ``log``, ``softplus``, ``logsumexp``, the
    losses ...): every 16-bit floating argument is cast to fp32 first (a copy autograd records, as
    CUDA's ``cached_cast`` makes it); the CPU runs them in the input dtype;
  * fp32_set_opt_dtype ops (``softmax``, ``log_softmax``, ``sum``, ``cumsum``, ``prod``, the vector
    norms): run with ``dtype=torch.float32`` when none is given; fp16 ``softmax``/``log_softmax`` on
    CUDA take the ``half_to_float`` kernel (no fp32 copy of the input: aten/src/ATen/native/SoftMax.cpp);
  * ``cross_entropy``: the CPU casts the 16-bit logits to fp32 first (``cross_entropy_loss`` is on its
    fp32 list); CUDA's decomposes it (aten/src/ATen/native/LossNLL.cpp ``cross_entropy_loss_symint``):
    ``log_softmax(self, class_dim, self.scalar_type())`` in the input dtype, then ``nll_loss`` (fp32
    list) on an fp32 copy of the log-probabilities, which ``nll_loss`` saves;
  * ``mv``/``addmv``/``addr``/``einsum``/``chain_matmul``/``multi_dot``: cast to the 16-bit dtype
    (CUDA's lower-precision list; the CPU's casts inside ``einsum`` at its ``bmm``);
  * sdpa (as patched above): q, k, v and a float mask cast to the 16-bit dtype first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_FUSED_DTYPES = (torch.float16, torch.bfloat16)


def _cuda_sdpa(original):
    """``F.scaled_dot_product_attention`` as CUDA dispatches it (see the module docstring)."""
    aten = torch.ops.aten

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if torch.is_autocast_enabled("cpu"):  # scaled_dot_product_attention is on CUDA's lower-precision list
            low = torch.get_autocast_dtype("cpu")
            query, key, value = (t.to(low) if t.dtype == torch.float32 else t for t in (query, key, value))
            if attn_mask is not None and attn_mask.dtype == torch.float32:
                attn_mask = attn_mask.to(low)
        d_qk, d_v = query.shape[-1], value.shape[-1]
        heads, kv_heads = query.shape[-3], key.shape[-3]
        if query.dim() != 4 or query.dtype not in _FUSED_DTYPES + (torch.float32,):
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                            scale=scale, enable_gqa=enable_gqa)
        gqa_ok = kv_heads == heads or (enable_gqa and heads % kv_heads == 0)
        if (attn_mask is None and query.dtype in _FUSED_DTYPES and d_qk == d_v and d_qk <= 256
                and d_qk % 8 == 0 and gqa_ok):
            out = aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False,
                                                           scale=scale)
            return out[0]
        align = 8 if query.dtype in _FUSED_DTYPES else 4
        if d_qk % align == 0 and d_v % align == 0 and kv_heads == heads:
            bias = attn_mask
            if bias is not None and bias.dtype == torch.bool:  # the kernel takes an additive bias
                bias = torch.zeros(bias.shape, dtype=query.dtype).masked_fill(~bias, torch.finfo(query.dtype).min)
            if bias is not None:
                bias = bias.expand(query.shape[0], heads, query.shape[-2], key.shape[-2])
            out = aten._scaled_dot_product_efficient_attention(query, key, value, bias, True, dropout_p, is_causal,
                                                               scale=scale)
            return out[0]
        with torch.autocast("cpu", enabled=False):  # inside the op, below autocast's dispatch key
            return _math(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    return sdpa


def _math(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """``_scaled_dot_product_attention_math`` (aten/src/ATen/native/transformers/attention.cpp, torch
    2.13; composite, the same code on CUDA and the CPU): 16-bit q, k, v upcast to fp32 (``query_acc``:
    ``allowFP16BF16ReductionMathSDP`` is off by default), q and the transposed (GQA: repeated) k each
    scaled by sqrt(scale), a bool or causal mask converted to an additive float one and added in
    place, ``_safe_softmax``, dropout (CUDA's ``at::dropout`` is the fused ``native_dropout``), times
    the (repeated) v, cast back to the input dtype."""
    import math

    origin = query.dtype
    up = lambda t: t.to(torch.float32) if t.dtype in _FUSED_DTYPES else t  # noqa: E731
    q_acc, key, value = up(query), up(key), up(value)
    factor = math.sqrt(scale if scale is not None else 1.0 / math.sqrt(q_acc.shape[-1]))
    q = q_acc * factor
    if is_causal:
        attn_mask = torch.ones(q.shape[-2], key.shape[-2], dtype=torch.bool).tril()
    if attn_mask is not None and attn_mask.dtype == torch.bool:  # convert_boolean_attn_mask
        attn_mask = torch.where(attn_mask.logical_not(), float("-inf"), torch.zeros((), dtype=q.dtype))
    if enable_gqa and key.shape[-3] != q.shape[-3]:  # pre_process_group_query_attention_input
        repeat = q.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(repeat, dim=-3), value.repeat_interleave(repeat, dim=-3)
    attn = q @ (key.transpose(-2, -1) * factor)
    if attn_mask is not None:
        attn.add_(attn_mask)
    attn = torch.ops.aten._safe_softmax(attn, -1)
    if dropout_p > 0.0:
        attn = torch.native_dropout(attn, dropout_p, True)[0]
    return (attn @ value).to(origin)


class _CudaLayerNorm(torch.autograd.Function):
    """``native_layer_norm`` with CUDA's saved tensors: the input, weight and bias, and the mean and
    rstd in the accumulation type (fp32 for 16-bit inputs: aten/src/ATen/native/cuda/layer_norm_kernel.cu
    ``layer_norm_cuda`` allocates them with ``acc_type``); the CPU kernel returns them in the input's
    dtype (``layer_norm_cpu``)."""

    @staticmethod
    def forward(ctx, x, weight, bias, shape, eps):
        out, mean, rstd = torch.native_layer_norm(x, shape, weight, bias, eps)
        if x.dtype in _FUSED_DTYPES:
            mean, rstd = mean.float(), rstd.float()
        ctx.shape = shape
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        mask = [ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[1],
                bias is not None and ctx.needs_input_grad[2]]
        dx, dw, db = torch.ops.aten.native_layer_norm_backward(grad, x, ctx.shape, mean.to(x.dtype),
                                                               rstd.to(x.dtype), weight, bias, mask)
        return dx, dw, db, None, None


def _cuda_layer_norm(original):
    def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
        if not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in (input, weight, bias)):
            return original(input, normalized_shape, weight, bias, eps)
        if torch.is_autocast_enabled("cpu"):  # layer_norm is on CUDA autocast's fp32 list
            input, weight, bias = (t.to(torch.float32) if t is not None and t.dtype in _FUSED_DTYPES else t
                                   for t in (input, weight, bias))
        return _CudaLayerNorm.apply(input, weight, bias, tuple(normalized_shape), eps)

    return layer_norm


@contextlib.contextmanager
def cuda_like_kernels(enabled: bool) -> Iterator[None]:
    """Patch ``torch.nn.functional.dropout``, ``scaled_dot_product_attention`` and ``layer_norm``;
    restore on exit."""
    if not enabled:
        yield
        return
    F = torch.nn.functional
    dropout, sdpa, layer_norm = F.dropout, F.scaled_dot_product_attention, F.layer_norm

    def fused_dropout(input, p=0.5, training=True, inplace=False):
        if training and 0.0 < p < 1.0 and input.numel() > 0:
            return torch.native_dropout(input, p, True)[0]
        return dropout(input, p, training, inplace)

    F.dropout, F.scaled_dot_product_attention, F.layer_norm = fused_dropout, _cuda_sdpa(sdpa), _cuda_layer_norm(layer_norm)
    try:
        yield
    finally:
        F.dropout, F.scaled_dot_product_attention, F.layer_norm = dropout, sdpa, layer_norm


_FP32_OPS = frozenset({
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt", "sinh",
    "tan", "pow", "__pow__", "__rpow__", "softplus", "layer_norm", "native_layer_norm", "group_norm",
    "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "hinge_embedding_loss", "kl_div",
    "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
    "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist",
    "pdist", "cdist", "renorm", "logsumexp"})
"""CUDA's ``AT_FORALL_FP32`` (torch 2.13), by the Python name of the function or method."""
_FP32_SET_DTYPE_OPS = frozenset({"prod", "softmax", "log_softmax", "cumprod", "cumsum", "sum", "vector_norm",
                                 "matrix_norm"})
"""CUDA's ``AT_FORALL_FP32_SET_OPT_DTYPE``: ``dtype=torch.float32`` unless the call gives one."""
_LOWER_CUDA_ONLY = frozenset({"mv", "addmv", "addr", "einsum", "chain_matmul", "multi_dot"})
"""On CUDA's lower-precision list, not on the CPU's (``einsum``: the CPU casts at its inner ``bmm``)."""
_LOW = (torch.float16, torch.bfloat16)


def _cast_args(obj, dtype: torch.dtype, when):
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() and when(obj.dtype) else obj
    if type(obj) in (list, tuple):
        return type(obj)(_cast_args(o, dtype, when) for o in obj)
    return obj


class _CudaAutocastPolicy(torch.overrides.TorchFunctionMode):
    """What CUDA's autocast does beyond the CPU's (see the module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if not torch.is_autocast_enabled("cpu"):
            return func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if name in _FP32_OPS:
            up = lambda d: d in _LOW  # noqa: E731
            return func(*_cast_args(args, torch.float32, up), **{k: _cast_args(v, torch.float32, up)
                                                                  for k, v in kwargs.items()})
        first = args[0] if args else kwargs.get("input")
        if name in _FP32_SET_DTYPE_OPS and isinstance(first, torch.Tensor) and first.is_floating_point():
            if kwargs.get("dtype") is None and not _dtype_positional(name, args):
                if name in ("softmax", "log_softmax") and first.dtype == torch.float16:
                    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
                    if isinstance(dim, int):  # the half_to_float kernel: fp32 out, no fp32 copy of the input
                        kernel = torch._softmax if name == "softmax" else torch._log_softmax
                        return kernel(first, dim, True)
                kwargs["dtype"] = torch.float32
            return func(*args, **kwargs)
        if name == "cross_entropy" and isinstance(first, torch.Tensor) and first.dtype in _LOW:
            out = _cuda_cross_entropy(args, kwargs)
            if out is not None:
                return out
        if name in _LOWER_CUDA_ONLY:
            low = torch.get_autocast_dtype("cpu")
            down = lambda d: d == torch.float32  # noqa: E731
            return func(*_cast_args(args, low, down), **{k: _cast_args(v, low, down) for k, v in kwargs.items()})
        return func(*args, **kwargs)


def _dtype_positional(name: str, args: tuple) -> bool:
    """``torch.softmax(x, dim, dtype)`` / ``torch.sum(x, dim, keepdim, dtype)`` with a positional dtype."""
    return any(isinstance(a, torch.dtype) for a in args[1:])


def _cuda_cross_entropy(args: tuple, kwargs: dict):
    """CUDA's ``cross_entropy_loss`` under autocast on 16-bit logits with class-index targets and no
    label smoothing: ``nll_loss(log_softmax(x, 1, x.dtype).float(), ...)``; None otherwise (run as is)."""
    names = ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction", "label_smoothing")
    call = dict(zip(names, args))
    call.update(kwargs)
    x, target = call["input"], call.get("target")
    if (call.get("label_smoothing", 0.0) or x.dim() != 2 or not isinstance(target, torch.Tensor)
            or target.is_floating_point() or call.get("size_average") is not None or call.get("reduce") is not None):
        return None
    logp = torch.nn.functional.log_softmax(x, 1, dtype=x.dtype)
    return torch.nn.functional.nll_loss(logp.to(torch.float32), target, call.get("weight"),
                                        ignore_index=call.get("ignore_index", -100),
                                        reduction=call.get("reduction", "mean"))


@contextlib.contextmanager
def autocast_region(dtype: torch.dtype | None) -> Iterator[None]:
    """``torch.autocast`` over the forward and the loss (CPU autocast; with ``cuda_autocast_policy``
    pushed around the whole step it runs as CUDA's), nothing when ``dtype`` is None."""
    if dtype is None:
        yield
        return
    with torch.autocast("cpu", dtype=dtype):
        yield


@contextlib.contextmanager
def cuda_autocast_policy(enabled: bool) -> Iterator[None]:
    """CUDA's autocast policy beyond the CPU's, pushed for the whole step: it acts only while CPU
    autocast is on, so a checkpointed block recomputed in backward (which re-enters autocast) gets it."""
    if not enabled:
        yield
        return
    with _CudaAutocastPolicy():
        yield
