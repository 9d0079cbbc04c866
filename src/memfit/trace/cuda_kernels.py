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
    q and k scaled by sqrt(scale) each, their product plus the mask, a softmax and dropout in the
    input dtype (the CPU math kernel upcasts 16-bit inputs to fp32 instead), then times v.

  Attention dropout runs inside both fused kernels (a Philox seed, no mask), as on the GPU.
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
        return _math(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    return sdpa


def _math(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """CUDA's ``_scaled_dot_product_attention_math``, in the input dtype."""
    import math

    s_q, s_kv = query.shape[-2], key.shape[-2]
    factor = math.sqrt(scale if scale is not None else 1.0 / math.sqrt(query.shape[-1]))
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        repeat = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(repeat, dim=-3), value.repeat_interleave(repeat, dim=-3)
    if is_causal:
        attn_mask = torch.ones(s_q, s_kv, dtype=torch.bool).tril()
    scores = (query * factor) @ (key * factor).transpose(-2, -1)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    probs = torch.ops.aten._safe_softmax(scores, -1)
    if dropout_p > 0.0:
        probs = torch.native_dropout(probs, dropout_p, True)[0]
    return probs @ value


@contextlib.contextmanager
def cuda_like_kernels(enabled: bool) -> Iterator[None]:
    """Patch ``torch.nn.functional.dropout`` and ``scaled_dot_product_attention``; restore on exit."""
    if not enabled:
        yield
        return
    F = torch.nn.functional
    dropout, sdpa = F.dropout, F.scaled_dot_product_attention

    def fused_dropout(input, p=0.5, training=True, inplace=False):
        if training and 0.0 < p < 1.0 and input.numel() > 0:
            return torch.native_dropout(input, p, True)[0]
        return dropout(input, p, training, inplace)

    F.dropout, F.scaled_dot_product_attention = fused_dropout, _cuda_sdpa(sdpa)
    try:
        yield
    finally:
        F.dropout, F.scaled_dot_product_attention = dropout, sdpa
