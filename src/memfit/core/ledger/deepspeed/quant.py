"""QLoRA under DeepSpeed: what a bitsandbytes 4-bit base adds to the DeepSpeed recipes.

The packed weights themselves are ordinary parameters to DeepSpeed (``Params4bit`` in
``bnb_4bit_quant_storage``: ``RecipeContext.quantized``): ZeRO-3 partitions and gathers them like any
frozen param (``ceil(p / W)`` elements of the storage dtype per rank), ZeRO-0/1/2 keep them whole. What
DeepSpeed does not see is each weight's quantization state, a plain attribute of the parameter
(``Params4bit.quant_state``: absmax, with double quantization the uint8 absmax, its fp32 absmax,
offset and code; ``bitsandbytes/functional.py:quantize_4bit``): every rank holds all of it, on the GPU
from the moment the weight is quantized there. And each quantized matmul dequantizes its (gathered)
weight while it runs, forward and backward (``memfit.core.quant_kernels``), one layer at a time.
"""

from __future__ import annotations

from memfit.core.ledger.context import RecipeContext
from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger_types import Device
from memfit.core.precision import DTYPE_BYTES
from memfit.core.quant import BLOCKSIZE_4BIT, quantized_tensors, shared_bytes
from memfit.core.quant_kernels import bnb_release

QUANT_STATE = "quant.state"
DEQUANT = "quant.dequantized_weight"


def record_quant_state(t: Timeline, ctx: RecipeContext) -> None:
    """Every quantized weight's state, whole on this rank's GPU (not partitioned by ZeRO-3)."""
    if not ctx.quantized:
        return
    q = ctx.scenario.quant
    per_weight = [[x.nbytes for x in quantized_tensors(q, shape)[1:]] for _, shape in ctx.quantized]
    total = sum(map(sum, per_weight)) + shared_bytes(q)
    t.declare(QUANT_STATE, name="bitsandbytes quantization state of every 4-bit weight (whole on every rank)",
              device=Device.GPU, category="params",
              formula=f"{len(per_weight)} weights: absmax"
                      + (" (uint8) + nested fp32 absmax per 256 + offset + code" if q.double_quant else " (fp32 per 64)")
                      + f" + NF4/FP4 code = {total:,} B",
              source="bitsandbytes functional.py:quantize_4bit (QuantState, a Params4bit attribute DeepSpeed does "
                     "not partition)")
    if shared_bytes(q):
        t.alloc(QUANT_STATE, shared_bytes(q))
    for sizes in per_weight:
        for n in sizes:
            t.alloc(QUANT_STATE, n)


def _largest(ctx: RecipeContext) -> int:
    return max((shape[0] * shape[1] for _, shape in ctx.quantized), default=0)


def declare_dequant(t: Timeline, ctx: RecipeContext) -> None:
    if not ctx.quantized:
        return
    q = ctx.scenario.quant
    version = ctx.scenario.runtime.bitsandbytes_version
    t.declare(DEQUANT, name="the largest 4-bit weight dequantized while its matmul runs (one layer at a time)",
              device=Device.GPU, category="params",
              formula=f"{_largest(ctx):,} elements x {DTYPE_BYTES[q.compute_dtype]} B (compute dtype), at the end of the "
                      "forward and the start of the backward, when the activations are highest",
              source=f"bitsandbytes {version} "
                     + ("functional.py:dequantize_4bit" if bnb_release(version).dequantize_in_state_dtype
                        else "backends/cuda/ops.py:_dequant_linear_fallback") + " (MatMul4Bit forward and backward)")


def record_dequant(t: Timeline, ctx: RecipeContext, *, backward: bool) -> None:
    """The largest quantized weight dequantized (``memfit.core.ledger.pytorch.step._dequant``'s sequence)."""
    if not ctx.quantized:
        return
    q = ctx.scenario.quant
    n = _largest(ctx)
    cb = DTYPE_BYTES[q.compute_dtype]
    state = ctx.load_bytes  # the weight's dtype when it was quantized (from_pretrained's torch_dtype)
    blocks = -(-n // BLOCKSIZE_4BIT)
    if backward or bnb_release(ctx.scenario.runtime.bitsandbytes_version).dequantize_in_state_dtype:
        sizes = [blocks * 4 if q.double_quant else 0, n * state] + ([n * cb] if state != cb else [])
    else:
        sizes = [2 * blocks * 4 if q.double_quant else 0, n * cb]
    for size in sizes:
        t.alloc(DEQUANT, size)
    for size in reversed(sizes):
        t.free(DEQUANT, size)
