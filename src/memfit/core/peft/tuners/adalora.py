"""AdaLoRA: LoRA in SVD form (``lora_A``, singular values ``lora_E``, ``lora_B``) at rank ``init_r``,
pruned towards ``target_r`` by importance scores during training (peft 0.21 ``tuners/adalora/``:
``AdaLoraModel._create_and_replace`` builds every layer at ``init_r``, ``AdaLoraLayer.update_layer``).

What else it allocates in training (``memfit.core.activations.adapters`` and the ledgers):

- ``RankAllocator.update_ipt`` (called through ``update_and_allocate`` after each optimizer step
  until ``total_step - tfinal``) keeps three tensors the size of every ``lora_A``/``lora_B``/``lora_E``:
  ``ipt``, ``exp_avg_ipt``, ``exp_avg_unc`` (``torch.zeros_like(p)``, then recomputed);
- ``AdaLoraModel.forward`` adds the orthogonality term: ``A @ A.T`` / ``B.T @ B`` (r x r) per layer.
"""

from __future__ import annotations

from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.lora_keys import LORA_KEYS
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners import defaults
from memfit.core.peft.tuners.base import Key, Settings, Tuner, free, keys, note, only, require, sized

IMPORTANCE_TENSORS = 3
"""``RankAllocator``: ``ipt``, ``exp_avg_ipt`` and ``exp_avg_unc`` per adapter parameter."""


def adalora_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """``lora_A (init_r, in)``, ``lora_B (out, init_r)``, ``lora_E (init_r, 1)`` and the frozen
    ``ranknum (1,)``."""
    r = s["init_r"]
    require(r >= 0, f"`r` should be a positive integer or 0, but the value passed is {r}")
    at = f".{ADAPTER_NAME}"
    return [AdapterTensor("lora_A" + at, (r, layer.in_features)), AdapterTensor("lora_B" + at, (layer.out_features, r)),
            AdapterTensor("lora_E" + at, (r, 1)), AdapterTensor("ranknum" + at, (1,), trainable=False)]


def _check(layer: Layer, s: Settings) -> None:
    total = s["total_step"]
    require(total is not None and total > 0, "AdaLoRA does not work when `total_step` is None, supply a value > 0.")
    require(s["tinit"] < total - s["tfinal"], "The supplied schedule values don't allow for a budgeting phase. "
            "Decrease `tfinal`/`tinit` or increase `total_step`.")
    require(not s["use_dora"], "ADALORA does not support DoRA.")


def _adalora_keys() -> dict[str, Key]:
    table = dict(LORA_KEYS)
    table["r"] = free("int", 8, "not used by AdaLoRA (layers are built at init_r)")
    table["lora_dropout"] = sized("float", 0.0, "dropout on the adapter's input: a mask and a copy per layer")
    table["use_dora"] = only(False, "AdaLoRA refuses DoRA")
    table["rank_pattern"] = note("dict", None, "the ranks a finished AdaLoRA run kept (saved after training); "
                                 "PeftModel.from_pretrained shrinks the layers to them, get_peft_model builds init_r: "
                                 "memfit plans init_r")
    table["loftq_config"] = only({}, "AdaLoRA refuses LoftQ")
    table.update(
        target_r=free("int", 8, "the rank budget pruning aims for (lora_E entries are zeroed, not removed)"),
        init_r=sized("int", 12, "the rank every layer is built with"),
        tinit=sized("int", 0, "steps before pruning starts"),
        tfinal=sized("int", 0, "final steps without importance updates"),
        deltaT=free("int", 1, "steps between budget updates"),
        beta1=free("float", 0.85, "EMA of the importance"),
        beta2=free("float", 0.85, "EMA of the uncertainty"),
        orth_reg_weight=free("float", 0.5, "weight of the orthogonality term (r x r per layer)"),
        total_step=sized("int", None, "training steps (required by peft)"),
    )
    return table


TUNER = Tuner(
    peft_type="ADALORA", method="adalora", prefix="lora_", source="peft/tuners/adalora/model.py, layer.py",
    targets=defaults.ADALORA, bias=True, keys=keys(**_adalora_keys()), tensors=adalora_tensors, check=_check,
)
