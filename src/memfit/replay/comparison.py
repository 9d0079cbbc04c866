"""What a comparison of a plan with a replay returns (``Comparison``: per item and per phase), and the
pieces every framework's comparison shares. No torch here."""

from __future__ import annotations

from dataclasses import dataclass

from memfit.core.ledger_types import Device, Plan

HOST = (Device.CPU_PINNED, Device.CPU_PAGEABLE)

ESTIMATE_KEYS = ("runtime.process", "runtime.cuda_context")
"""Plan items that are not tensors (the replay's tracker cannot see them), with every ``host.*``
item (``memfit.core.ledger.host_process``: the process's imports, tokenizer, workers, heap)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemComparison:
    key: str
    """The replay's attribution key."""
    at: str = "initialize"
    ledger_keys: tuple[str, ...]
    predicted_bytes: int
    measured_bytes: int
    predicted_pinned_bytes: int = 0
    """Bytes of the ledger lines that DeepSpeed pins (CUDA placement)."""
    measured_pinned_bytes: int | None = None
    """The replay's: bytes whose storage went through ``pin_memory`` (None: an old fixture)."""
    deepspeed_pins: bool | None = None
    """DeepSpeed's own flag for these tensors (see ``AttributedItem.deepspeed_pins``)."""
    pinned_compared: bool = True
    """False for the torch/DDP/FSDP replays: their child reads sizes off the objects and does not
    attribute pinned storages (nothing is pinned on the CPU accelerator there), so only bytes count."""

    @property
    def diff_bytes(self) -> int:
        return self.predicted_bytes - self.measured_bytes

    @property
    def matches(self) -> bool:
        pinned_ok = self.measured_pinned_bytes == self.predicted_pinned_bytes or not self.pinned_compared
        return self.diff_bytes == 0 and pinned_ok

    @property
    def flag_agrees(self) -> bool:
        """The measured pinned bytes are what DeepSpeed's flag says: all of it or none."""
        if self.deepspeed_pins is None or self.measured_pinned_bytes is None:
            return self.measured_pinned_bytes in (0, None)
        return self.measured_pinned_bytes == (self.measured_bytes if self.deepspeed_pins else 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseComparison:
    phase: str
    predicted_host_bytes: int
    """The plan's host peak of the phase, tensors only (estimates of non-tensor memory removed)."""
    measured_host_bytes: int
    """The replay's host tensor peak in the occurrences of this phase (``occurrences``: step 1's
    first micro-step for ``forward``, the worst later step for ``step2.*``), above what the child
    held before the model was built (``baseline_bytes``)."""
    baseline_bytes: int = 0
    """Host tensor bytes live when ``load`` began: what the imported libraries allocated (it varies
    with the machine: 16 B on one, 144 B on another); the plan starts from nothing."""
    predicted_pinned_bytes: int = 0
    """Pinned part of the plan's host peak (CUDA placement of the items live at it)."""
    measured_pinned_bytes: int | None = None
    """Pinned part of the replay's host live at its peak."""
    predicted_pinned_end_bytes: int = 0
    measured_pinned_end_bytes: int | None = None
    predicted_gpu_bytes: int | None = None
    measured_gpu_bytes: int | None = None

    @property
    def diff_bytes(self) -> int:
        return self.predicted_host_bytes - self.measured_host_bytes

    @property
    def rel_diff(self) -> float:
        return self.diff_bytes / self.measured_host_bytes if self.measured_host_bytes else 0.0

    @property
    def predicted_pageable_bytes(self) -> int:
        return self.predicted_host_bytes - self.predicted_pinned_bytes

    @property
    def measured_pageable_bytes(self) -> int | None:
        return None if self.measured_pinned_bytes is None else self.measured_host_bytes - self.measured_pinned_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    case: str
    items: tuple[ItemComparison, ...]
    phases: tuple[PhaseComparison, ...]
    missing: tuple[str, ...] = ()
    """``key@at`` the replay should have reported (the rule applies) and did not."""
    unknown: tuple[str, ...] = ()
    """``key@at`` the replay reported that no rule compares."""
    notes: tuple[str, ...] = ()

    @property
    def exact_items_match(self) -> bool:
        return all(i.matches for i in self.items) and not self.missing and not self.unknown

    def phase(self, name: str) -> PhaseComparison:
        for p in self.phases:
            if p.phase == name:
                return p
        raise KeyError(name)


def tensor_host_peak(plan: Plan, phase: str) -> int:
    ph = plan.phase(phase)
    est = sum(i.bytes for i in ph.items if (i.key in ESTIMATE_KEYS or i.key.startswith("host.")) and i.device in HOST)
    return ph.cpu_peak_bytes - est
