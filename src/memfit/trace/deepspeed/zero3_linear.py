"""DeepSpeed ZeRO-3's replacement for ``torch.nn.functional.linear``, for tracing its memory.

DeepSpeed 0.19.8 sets ``torch.nn.functional.linear = zero3_linear_wrap`` whenever ZeRO-3 partitions
a model (``zero.Init`` as a context, or ``Init(module=...)`` from the engine) and
``memory_efficient_linear`` is on (the default): deepspeed/runtime/zero/partition_parameters.py
``_enable_mem_efficient_linear``. Its ``LinearFunctionForZeroStage3`` (deepspeed/runtime/zero/
linear.py) saves ``input, weight, bias`` for every call, so a frozen Linear keeps its input alive
until backward, unlike ``torch.nn.functional.linear`` (whose ``mm`` saves the input only when the
weight needs a gradient). This module mirrors that function op for op without importing deepspeed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class Zero3LinearFunction(torch.autograd.Function):
    """Forward and backward of ``LinearFunctionForZeroStage3`` (deepspeed/runtime/zero/linear.py)."""

    @staticmethod
    def forward(input, weight, bias=None):
        if input.dim() == 2 and bias is not None:
            return torch.addmm(bias, input, weight.t())
        output = input.matmul(weight.t())
        if bias is not None:
            output += bias
        return output

    @staticmethod
    def setup_context(ctx, inputs, output):
        input, weight, bias = inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None
        ctx.save_for_backward(input, weight, bias)

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, bias = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        dim = grad_output.dim()
        if ctx.needs_input_grad[0]:
            grad_input = grad_output.matmul(weight)
        if ctx.needs_input_grad[1]:
            if dim > 2:
                grad_weight = grad_output.reshape(-1, grad_output.shape[-1]).t().matmul(
                    input.reshape(-1, input.shape[-1]))
            elif dim == 1:
                grad_weight = grad_output.unsqueeze(-1) * input.unsqueeze(0)
            else:
                grad_weight = grad_output.t().matmul(input)
        if bias is not None and ctx.needs_input_grad[2]:
            if dim > 2:
                grad_bias = grad_output.sum([i for i in range(dim - 1)])
            elif dim == 1:
                grad_bias = grad_output
            else:
                grad_bias = grad_output.sum(0)
        return grad_input, grad_weight, grad_bias


def zero3_linear(input, weight, bias=None):
    return Zero3LinearFunction.apply(input, weight, bias)


@contextlib.contextmanager
def zero3_linear_patched(enabled: bool) -> Iterator[None]:
    """``torch.nn.functional.linear`` replaced as DeepSpeed ZeRO-3 does, restored on exit."""
    if not enabled:
        yield
        return
    original = torch.nn.functional.linear
    torch.nn.functional.linear = zero3_linear
    try:
        yield
    finally:
        torch.nn.functional.linear = original
