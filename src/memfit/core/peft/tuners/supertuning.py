"""Super-Tuning: a trained sparse set of ``int(out * in * (1 - sparsity))`` entries of each adapted weight, at the
largest (or smallest) magnitudes, scatter-added onto the frozen weight in the forward; with ``r`` also a LoRA
beside it ("Supra") (peft 0.21.2 ``tuners/supertuning/``: ``SupertuningLayer.__init__``, ``update_layer``,
``_num_trainable``; ``SupertuningConfig.__post_init__``)."""

from __future__ import annotations

from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners import defaults
from memfit.core.peft.tuners.base import INIT, MODULES_TO_SAVE, TARGETS, Settings, Tuner, free, keys, require, sized


def trained_entries(layer: Layer, sparsity: float) -> int:
    """``int(num_params * (1 - sparsity))`` (``SupertuningLayer._num_trainable``)."""
    return int(layer.in_features * layer.out_features * (1 - sparsity))


def _check(layer: Layer, s: Settings) -> None:
    """``SupertuningConfig.__post_init__``'s refusals and ``update_layer``'s."""
    sp, r, p = s["sparsity"], s["r"], s["lora_dropout"]
    require(0.0 <= sp < 1.0, f"sparsity must be in [0.0, 1.0), got {sp}")
    require(r is None or r > 0, f"r must be a positive integer or None, got {r!r}")
    require(r is not None or s["lora_alpha"] is None, "lora_alpha is set but r is None — Supra mode requires an "
            "explicit r.")
    require(0.0 <= p < 1.0, f"lora_dropout must be in [0.0, 1.0), got {p}")
    n = layer.in_features * layer.out_features
    require(trained_entries(layer, sp) >= 1, f"sparsity={sp} leaves no trainable entries for a weight with {n} "
            f"elements — no parameter would be adapted. Lower the sparsity so at least one entry is trainable. "
            f"({layer.module})")


def supertuning_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """``supertuning_values (n,)`` fp32 (``torch.zeros(num_trainable, dtype=torch.float32)``); with ``r`` the
    ``nn.Linear``s ``supertuning_lora_A (r, in)`` and ``supertuning_lora_B (out, r)``, fp32, without bias; the
    buffer ``supertuning_indices (n,)`` int32 (``topk``'s indices ``.to(torch.int32)``; ``BufferDict(persistent=
    save_precomputed_indices)``)."""
    n = trained_entries(layer, s["sparsity"])
    r = s["r"]
    at = f".{ADAPTER_NAME}"
    out = [AdapterTensor("supertuning_values" + at, (n,))]
    if r is not None:
        out += [AdapterTensor(f"supertuning_lora_A{at}.weight", (r, layer.in_features)),
                AdapterTensor(f"supertuning_lora_B{at}.weight", (layer.out_features, r))]
    return out + [AdapterTensor("supertuning_indices" + at, (n,), buffer="int32",
                                persistent=bool(s["save_precomputed_indices"]))]


TUNER = Tuner(
    peft_type="SUPERTUNING", method="supertuning", prefix="supertuning_",
    source="peft/tuners/supertuning/layer.py:SupertuningLayer.update_layer",
    targets=defaults.LORA, kinds=frozenset({"linear"}),
    keys=keys(
        target_modules=TARGETS, modules_to_save=MODULES_TO_SAVE,
        sparsity=sized("float", 0.99, "out x in x (1 - sparsity) entries trained per layer"),
        select_top=free("bool", True, "the largest or the smallest magnitudes: same count"),
        r=sized("int", None, "rank of the LoRA beside the sparse entries (Supra); none without"),
        lora_alpha=free("float", None, "scales the LoRA's output only (2 r when not given)"),
        lora_dropout=sized("float", 0.0, "dropout on the LoRA's input: a mask and a copy per layer"),
        init_weights=INIT,
        save_precomputed_indices=sized("bool", True, "the int32 indices are a persistent buffer (in the state dict)"),
    ),
    tensors=supertuning_tensors,
    check=_check,
)
