"""The accelerator's kernel set: which kernel torch runs for the ops whose saved tensors differ between
CUDA and the CPU, as the activation model plans them (pure arithmetic; issue 26).

``estimate_activation_bytes(kernels=...)`` takes ``cuda`` (a GPU plan, the default, unchanged) or
``cpu`` (``accelerator: cpu``: the live gloo worlds and CPU replays). ``memfit.trace.cuda_kernels``
makes a fake-tensor trace run CUDA's choices on this CPU; ``TraceOptions(kernels="cpu")`` traces the
CPU's own. The table (torch 2.13):

=================  =======================================================  =================================================
op                 CUDA (sm80+)                                             CPU
=================  =======================================================  =================================================
sdpa backend       ``select_sdp_backend`` (aten/src/ATen/native/             ``select_sdp_backend_cpp`` (aten/src/ATen/native/
                   transformers/cuda/sdp_utils.cpp): flash (16-bit, no      transformers/sdp_utils_cpp.cpp, ``priority_order_cpp``:
                   mask, head width <= 256 and % 8, GQA with                flash, then math). ``use_flash_attention_cpp``: fp32,
                   ``enable_gqa``), memory-efficient (widths % 8, % 4 in    fp64, bf16, fp16; no dropout (``check_for_dropout``);
                   fp32; equal heads; a mask as an additive bias), else     one head width for q, k and v
                   math                                                     (``check_head_dim_size_cpp``); any mask
                                                                            (``check_attn_mask_shape``); GQA with
                                                                            ``enable_gqa`` (``check_batch_size_and_num_heads_
                                                                            dense<true>``); else math
flash saves        q, k, v, output, fp32 logsumexp ``(b, heads, s)``, the   ``ScaledDotProductFlashAttentionForCpuBackward0``: q,
                   Philox seed/offset (24 B); output tokens-major (follows  k, v as given (GQA: unrepeated), output, fp32
                   q's layout: transformers' ``transpose(1, 2)               logsumexp ``(b, heads, s)``, the mask converted to
                   .contiguous()`` is a view)                               the query's dtype (``convert_boolean_attn_mask_cpu``,
                                                                            not expanded); no RNG state; its output
                                                                            follows q's layout, as CUDA's
math kernel        ``_scaled_dot_product_attention_math`` (attention.cpp), the same composite code on both; its dropout is
                   ``at::dropout``: CUDA's fused ``native_dropout`` saves a bool mask (1 B per element,
                   ``is_fused_kernel_acceptable`` in aten/src/ATen/native/Dropout.cpp), the CPU's ``_dropout_impl``
                   saves its noise tensor in the input's dtype (fp32 in the math kernel: 4 B per element)
cross-entropy      ``cross_entropy_loss_symint`` (aten LossNLL.cpp): ``log_softmax`` then ``nll_loss``, the same on both;
                   ``log_softmax``'s backward result is fp32 for fp32 input on both
=================  =======================================================  =================================================

Autocast (CPU: bf16 only in this model, ``torch.autocast("cpu")``'s ``KERNEL_CPU`` lists in
aten/src/ATen/autocast_mode.cpp; the same cast cache of fp32 leaf weights, ``cached_cast``) and
LayerNorm's statistics are not in this table yet: a CPU plan of AMP (or of a 16-bit LayerNorm model)
uses CUDA's op lists and is labelled so (``KernelSet.unmodelled``, in the activation formula). Checked:
the Llama-style families (``families``) with either set equal a trace of the same kernels to 8 B
(tests/trace/test_cpu_kernel_set.py); BERT, T5 and DeBERTa, whose dropout and LayerNorm statistics
differ on the CPU, are 10-45% under a CPU-kernel trace with ``kernels="cpu"`` (measured, not yet
modelled); GPT-2 and GPT-J (no ``LayerLayout``) are planned with CUDA's kernels whatever the set.
"""

from __future__ import annotations

from typing import NamedTuple

from memfit.core.lean_dataclass import dataclass

KERNEL_SETS = ("cuda", "cpu")


@dataclass(frozen=True, slots=True)
class KernelSet:
    """One accelerator's kernel choices (see the module docstring's table)."""

    name: str
    sdpa_source: str
    dropout_mask_bytes: int | None
    """Bytes per element of the mask a non-fused dropout saves: 1 (CUDA's bool mask), None (the CPU's
    noise tensor, in the input's dtype)."""
    unmodelled: tuple[str, ...] = ()
    """What this set plans with CUDA's choices still (said in the plan's activation formula)."""


CUDA = KernelSet("cuda", "torch 2.13 aten/src/ATen/native/transformers/cuda/sdp_utils.cpp select_sdp_backend", 1)
CPU = KernelSet("cpu", "torch 2.13 aten/src/ATen/native/transformers/sdp_utils_cpp.cpp select_sdp_backend_cpp", None,
                unmodelled=("autocast's op lists (the CPU's differ)",
                            "LayerNorm's statistics (the CPU's are in the input dtype, CUDA's fp32)",
                            "dropout outside attention (the CPU saves a noise tensor, CUDA a bool mask)",
                            "sdpa with attention dropout in the BERT/T5/NeoX stacks (the CPU runs math)"))
BY_NAME = {k.name: k for k in (CUDA, CPU)}


class Sdpa(NamedTuple):
    """How ``F.scaled_dot_product_attention`` runs (``families.sdpa``) and what it keeps for backward."""

    kind: str
    """``flash``, ``efficient`` or ``math``."""
    repeat: bool
    """transformers repeated k and v to every query head before the call (``repeat_kv``: a mask, or head
    widths the GQA kernels do not take; integrations/sdpa_attention.py ``use_gqa_in_sdpa``)."""
    kernel: int
    """Bytes the kernel keeps besides the q, k, v it is given and its output: the logsumexp and RNG
    state (flash, efficient), the mask as an additive bias (efficient, CPU flash); the math kernel's own fp32
    tensors (scaled q and k, the probabilities, its copy of v)."""
    keeps_qkv: bool
    """The kernel keeps the q, k and v it is given and its output (flash, efficient)."""
    keeps_v: bool
    """The math kernel keeps the v it is given (fp32 inputs, no repeat inside it)."""


def cpu_sdpa(*, K: int, b: int, heads: int, kv_heads: int, d_qk: int, d_v: int, s: int, skv: int, masked: bool,
             repeat: bool, enable_gqa: bool, dropout: float, bias: int | None) -> Sdpa:
    """The CPU's choice for q, k, v of ``K`` bytes per element (the table above) and its saved tensors."""
    given = heads if repeat else kv_heads
    if dropout <= 0 and d_qk == d_v and (given == heads or (enable_gqa and heads % given == 0)):
        n = 4 * b * heads * s  # the fp32 logsumexp (fp32 for fp32, bf16 and fp16 inputs)
        if masked:
            n += K * b * s * skv if bias is None else bias  # the mask in the query's dtype
        return Sdpa("flash", repeat, n, True, False)
    # math: fp32 q and k scaled, probabilities; dropout's noise (fp32) and output
    n = 4 * b * heads * s * d_qk + 4 * b * heads * skv * d_qk + 4 * b * heads * s * skv
    if dropout > 0:
        n += 8 * b * heads * s * skv
    keeps_v = False
    if enable_gqa and given != heads:
        n += 4 * b * heads * skv * d_v
    elif K == 2:
        n += 4 * b * given * skv * d_v
    else:
        keeps_v = True
    return Sdpa("math", repeat, n, False, keeps_v)
