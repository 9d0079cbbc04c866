"""Pieces every activation model shares (pure arithmetic): what attention keeps for backward, the
Linear layers LoRA adapts when the config names none, and where the causal-LM loss's tensors come from.

``analytic`` (GPT-J, GPT-2, Llama-like) and the ``LayerLayout`` families (``families``,
``stacks``, ``layout``) import these; none of them imports another for them.
"""

from __future__ import annotations

from memfit.core.model import ArchSpec
from memfit.core.peft.lora import LORA_DEFAULT_TARGET_MODULES
from memfit.core.peft.spec import PeftSpec


LORA_DEFAULT_TARGETS = LORA_DEFAULT_TARGET_MODULES
"""peft's ``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`` (``memfit.core.peft.lora``: the one copy)."""


CAUSAL_LM_LOSS = ("transformers/loss/loss_utils.py:ForCausalLMLoss (logits.float(), nn.functional.pad + "
                  "labels[..., 1:].contiguous(); fixed_cross_entropy -> cross_entropy = log_softmax + nll_loss) "
                  "(transformers 5.24)")
"""Where the causal-LM loss tensors come from."""


def _lora_targets(arch: ArchSpec, peft: PeftSpec) -> tuple[str, ...]:
    if peft.target_modules:
        return tuple(peft.target_modules)
    pattern = getattr(peft, "target_modules_pattern", None)
    if pattern and pattern.lower() == "all-linear":
        return ("q_proj", "k_proj", "v_proj", "o_proj", "out_proj", "gate_proj", "up_proj", "down_proj", "fc_in",
                "fc_out", "c_attn", "c_proj", "c_fc")
    default = LORA_DEFAULT_TARGETS.get(arch.model_type, ("q_proj", "v_proj"))
    return (default,) if isinstance(default, str) else tuple(default)


def _attention_bytes(*, D: int, b: int, s: int, skv: int, t: int, hq: int, hkv: int, a: int, eager: bool,
                     gqa: bool, repeat_kv: bool, upcast_qk: bool, softmax_bytes: int) -> int:
    """Inside attention: q, k, v, the output, and (eager) the score matrices."""
    kv_heads_width = hq if repeat_kv else hkv
    if eager:
        qk = 4 * b * s * hq + 4 * b * skv * hq if upcast_qk else D * b * s * hq + D * b * skv * kv_heads_width
        probs = softmax_bytes * b * a * s * skv + (D * b * a * s * skv if softmax_bytes != D else 0)
        return qk + probs + D * b * skv * kv_heads_width + D * t * hq
    return D * t * hq + 2 * D * b * skv * kv_heads_width + D * t * hq + 4 * b * a * s
