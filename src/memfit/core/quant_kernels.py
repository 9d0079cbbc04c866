"""bitsandbytes' quantized matmuls per release: what ``MatMul4Bit`` and ``MatMul8bitLt`` keep for backward
and how the 4-bit forward dequantizes (``bitsandbytes/autograd/_functions.py``, ``nn/modules.py``).

Read from the release tags' source (``git show <tag>:bitsandbytes/autograd/_functions.py``) for
0.39.1 ... 0.50.1; 0.50.2 (installed) also runs here on its CPU backend
(``tests/trace/test_bnb_matmul_vs_trace.py``):

- 4-bit, up to 0.43.1: ``ctx.tensors = (A, B)`` when the input or weight needs a gradient: every
  ``Linear4bit`` keeps its input as it reached the matmul, ``x.to(compute_dtype)``
  (``Linear4bit.forward``), for the whole backward. From 0.43.2 (PR #1270): ``(None, B)``.
- 4-bit forward, up to 0.49: ``F.linear(A, F.dequantize_4bit(B, state).to(A.dtype).t())``: the weight
  dequantized in the dtype it had when quantized (``state.dtype``, the load dtype), then a copy in
  the compute dtype when they differ; with double quantization the fp32 absmax is rebuilt first.
  From 0.50: ``bitsandbytes::gemm_4bit`` (``backends/cuda/ops.py``): dequantized straight into the
  compute dtype (``_dequant_linear_fallback``), or a fused kernel for at most 1536 rows.
- 4-bit backward, every release: ``F.dequantize_4bit(B, state).to(grad dtype)`` for the input's gradient.
- 8-bit (LLM.int8()), every release: ``ctx.tensors = (CAt, subA, A)`` when a gradient is needed: the
  input ``A`` itself (``Linear8bitLt`` does not cast it) and ``subA``, the input's outlier columns
  above ``threshold`` (6.0; data-dependent, not counted). Up to 0.44: ``F.double_quant(A.to(fp16))``
  always, so ``CAt`` (int8, tokens x in) and ``SCAt`` (fp32, one per input column) are kept too; from
  0.45 the frozen weight's fast path (``int8_vectorwise_quant``) makes neither.
"""

from __future__ import annotations

from functools import lru_cache

from memfit.core.lean_dataclass import dataclass
from memfit.errors import MemfitError

DEFAULT_BNB_VERSION = "0.50.2"
"""The release installed here (and read in full): the plan's default when the stack does not say."""


@dataclass(frozen=True, slots=True)
class BnbRelease:
    """One bitsandbytes release's matmul behaviour (module doc)."""

    version: str
    saves_4bit_input: bool
    """``MatMul4Bit`` keeps ``A`` (the input cast to the compute dtype) for backward (<= 0.43.1)."""
    dequantize_in_state_dtype: bool
    """The 4-bit forward dequantizes in the weight's original dtype, then casts (<= 0.49)."""
    int8_keeps_transposed: bool
    """``MatMul8bitLt`` keeps ``CAt`` (int8) and ``SCAt`` (fp32) beside ``A`` (<= 0.44)."""

    @property
    def source(self) -> str:
        return f"bitsandbytes {self.version} autograd/_functions.py (MatMul4Bit, MatMul8bitLt)"


def _parse(version: str) -> tuple[int, int, int]:
    parts = str(version).strip().split(".")
    if not 2 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise MemfitError(f"bitsandbytes version must look like 0.43.1, got {version!r}")
    major, minor, patch = (int(p) for p in (*parts, "0")[:3])
    return major, minor, patch


@lru_cache(maxsize=64)
def bnb_release(version: str) -> BnbRelease:
    """The matmul behaviour of bitsandbytes ``version`` (0.39 and later; refused before: not read)."""
    v = _parse(version)
    if v < (0, 39, 0):
        raise MemfitError(f"bitsandbytes {version} is older than memfit models (0.39.1 ... 0.50.x were read)")
    if v >= (0, 51, 0):
        raise MemfitError(f"bitsandbytes {version} is newer than memfit models (0.39.1 ... 0.50.x were read)")
    return BnbRelease(version=str(version), saves_4bit_input=v <= (0, 43, 1), dequantize_in_state_dtype=v < (0, 50, 0),
                      int8_keeps_transposed=v < (0, 45, 0))
