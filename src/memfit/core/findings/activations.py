"""The activation figure's label: a plan of a kind the standing grid finds off says so, with the gap.

``memfit.core.activations.unreached.OFF_KINDS`` is the list (the grid test,
``tests/trace/test_activation_grid.py``, derives its off cells from it); every framework's findings
end with this one where it applies.
"""

from __future__ import annotations

from memfit.core.activations.unreached import GRID, OffKind, off_kind, precision_mode
from memfit.core.ledger_types import Finding
from memfit.core.scenario.types import Scenario


def planned_precision(sc: Scenario) -> str:
    """The grid's precision mode of this plan: DeepSpeed's fp16/bf16 and FSDP's 16-bit param_dtype are
    pure 16-bit compute; torch's AMP modes an fp32 model under autocast."""
    if sc.framework == "deepspeed":
        return sc.deepspeed.precision
    if sc.framework in ("fsdp", "fsdp2") and sc.fsdp.mixed_precision != "none":
        return sc.fsdp.mixed_precision
    mode = sc.torch.precision
    return precision_mode("fp32", mode.removeprefix("amp_")) if mode.startswith("amp_") else mode


def planned_kind(sc: Scenario) -> OffKind | None:
    """The kind of ``OFF_KINDS`` this plan is of (None for a quantized base: the grid has none)."""
    if sc.quant.enabled:
        return None
    return off_kind(sc.model.arch, method=sc.peft.method, precision=planned_precision(sc),
                    attention=sc.train.attention, checkpointing=sc.train.gradient_checkpointing,
                    seq_len=sc.train.seq_len, target_len=sc.train.target_len)


def activation_findings(sc: Scenario) -> tuple[Finding, ...]:
    kind = planned_kind(sc)
    if kind is None:
        return ()
    cell, gap = kind.worst
    cells = "; ".join(f"{c} {g:+.3%}" for c, g in kind.measured)
    return (Finding(id="activations-off-grid", severity="warning", message=(
        f"The activations of this configuration ({kind.describe()}) are of a kind the analytic model does not "
        f"reach: on the standing grid ({GRID}: small configs of the same family traced through the model's own "
        f"code on fake tensors) the analytic figure is off by up to {gap:+.3%} ({cells}; elsewhere within 0.5%). "
        f"Why: {kind.reason}. The activation items here carry that error; the rest of the ledger does not.")),)
