"""PEFT tuners whose forward raises under DeepSpeed's params-only cast of an fp32-built model.

From DeepSpeed 0.19.2, ``deepspeed.initialize`` with fp16/bf16 casts the parameters only and keeps
fp32 buffers (``stack.deepspeed.casts_params_only``). These tuners keep fp32 buffers (or fp32
factors) that their forward multiplies with the now 16-bit input or weights, and torch refuses a
matmul of two dtypes ("expected m1 and m2 to have the same dtype"). Each was run through peft's own
forward on a Llama-shaped model built in fp32 and cast that way
(``tests/trace/test_tuner_activations_vs_trace.py::test_forward_raises_under_the_params_only_cast``,
which fails if one of them stops raising); every other tuner of that test's cases runs.
"""

from __future__ import annotations

RAISES_UNDER_PARAMS_ONLY_CAST: dict[str, str] = {
    "osf": "its fp32 factors meet the 16-bit input in a matmul",
    "pvera": "its fp32 projection buffers meet the 16-bit input (as VeRA's shared projections)",
    "tinylora": "its fp32 SVD buffers meet the 16-bit trained R",
    "unilora": "its fp32 scale buffers meet the 16-bit input",
    "adamss": "AdamssLayer.dtype is the weight's dtype when peft built it (fp32), so the input cast to it meets the "
              "16-bit weight",
}
"""peft method -> what meets what."""
