"""Which of the plan's phases a recorded phase stands for, and the plan's figures for it.

A training script marks the phases it can see (``memfit.record``): ``load``, ``initialize`` (the whole
``deepspeed.initialize``) or ``setup`` (wrapping, optimizer creation), ``forward``, ``backward``,
``optimizer_step``, their later micro-steps (``accum.*``) and steps (``step2.*``), ``save``
(BRIEF contract 1). A recorded phase covers:

- the plan phase of the same name, when the plan has it;
- ``initialize`` (and ``setup`` when the plan has none): every ``initialize.*`` phase of the plan;
- ``accum.X`` / ``step2.X`` when the plan has no such phase: the plan's ``X`` (said in the row's note);
- ``recorded`` / ``whole run``: every plan phase.

Planned figures for several plan phases are their maximum. ``allocated`` is the GPU items live at the
phase's peak that are tensors, as requested (items outside the caching allocator, the CUDA context
and the like, are left out). Where the plan ran its allocator simulators (``allocators_simulated``),
``reserved`` is its simulated reserved peak, ``pinned`` the page-locked bytes (power-of-two blocks,
cached frees) and ``nvidia_smi`` reserved + memory outside PyTorch; otherwise ``reserved`` has no
planned figure, ``pinned`` is the pinned bytes requested and ``nvidia_smi`` the GPU peak.
"""

from __future__ import annotations

from memfit.core.ledger_types import Device, PhaseLedger, Plan

NON_TENSOR_CATEGORIES = ("runtime",)
"""GPU items the caching allocator never sees (with ``LedgerItem.outside_allocator``)."""


def outside_allocator(item) -> bool:
    return bool(getattr(item, "outside_allocator", False)) or item.category in NON_TENSOR_CATEGORIES

ORDER = ("load", "initialize", "initialize.cast", "initialize.move", "initialize.partition", "initialize.optimizer",
         "setup", "forward", "backward", "accum.forward", "accum.backward", "optimizer_step", "step2.forward",
         "step2.backward", "step2.optimizer_step", "save", "recorded")
WHOLE_RUN = "whole run"


def covered(plan: Plan, name: str) -> tuple[tuple[str, ...], str]:
    """(plan phases, note) for recorded phase ``name``."""
    names = tuple(p.name for p in plan.phases)
    if name in names:
        return (name,), ""
    if name in ("recorded", WHOLE_RUN):
        return names, ""
    init = tuple(n for n in names if n.startswith("initialize."))
    if name == "initialize" or (name == "setup" and init):
        return init, ("" if name == "initialize" else "the plan has no setup phase: compared with its initialize.* phases")
    for prefix in ("accum.", "step2."):
        if name.startswith(prefix) and name[len(prefix):] in names:
            base = name[len(prefix):]
            what = "steady-state" if prefix == "step2." else "later micro-step"
            return (base,), f"the plan has no {what} phase: compared with its {base} (step 1) figures"
    return (), f"the plan has no phase {name!r}"


def tensor_gpu_bytes(ph: PhaseLedger) -> int:
    return sum(i.bytes for i in ph.items if i.device is Device.GPU and not outside_allocator(i))


def tensor_gpu_exact(ph: PhaseLedger) -> bool:
    return all(i.exact for i in ph.items if i.device is Device.GPU and not outside_allocator(i))


def peak_phase(plan: Plan, names: tuple[str, ...]) -> PhaseLedger | None:
    """The covered plan phase with the most tensor bytes on the GPU."""
    phases = [plan.phase(n) for n in names]
    return max(phases, key=tensor_gpu_bytes) if phases else None


def order_key(name: str, seen: dict[str, int]) -> tuple[int, int]:
    if name in ORDER:
        return ORDER.index(name), 0
    return len(ORDER), seen.get(name, 0)
