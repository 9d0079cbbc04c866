"""Trace the memory of CUDA kernel choices while running on the CPU device.

Two ops pick a different kernel on a GPU than on the CPU, with different saved tensors:

- dropout: ``torch.nn.functional.dropout`` in training calls the fused ``native_dropout`` only for
  CUDA inputs (aten/src/ATen/native/Dropout.cpp ``is_fused_kernel_acceptable``), which saves a bool
  mask (1 byte per element); on the CPU it multiplies by a noise tensor of the input's dtype and
  saves that (2 bytes per element in fp16). Here training-mode dropout calls ``native_dropout``.
- scaled_dot_product_attention with ``dropout_p > 0``: CUDA's flash and memory-efficient kernels
  support dropout (they save the output, the logsumexp and a Philox seed, no mask); the CPU flash
  kernel does not, and the math fallback materializes the score and dropout-mask matrices. Here
  sdpa runs with ``dropout_p=0`` so it stays on the flash kernel, whose saved tensors are the same.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


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

    def flash_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs):
        return sdpa(query, key, value, attn_mask=attn_mask, dropout_p=0.0, is_causal=is_causal, scale=scale, **kwargs)

    F.dropout, F.scaled_dot_product_attention = fused_dropout, flash_sdpa
    try:
        yield
    finally:
        F.dropout, F.scaled_dot_product_attention = dropout, sdpa
