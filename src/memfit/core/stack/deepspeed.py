"""Which of memfit's DeepSpeed allocation models a DeepSpeed release runs (``Scenario.ds_version``).

The ledger's DeepSpeed recipes (``core/ledger/deepspeed/``) model three lines, each read from the
release's source: 0.19 (0.19.8, installed here), 0.6 (0.6.x, Feb-Jul 2022) and 0.5 (0.5.10's
source, which ``tests/conftest.py:ds0510`` downloads; 0.5.8, the seed case's release, allocates the
same in every recipe memfit models: ``stage3.py``, ``stage2.py``, ``partition_parameters.py`` and
``engine.py:_configure_distributed_model`` differ from 0.5.10 in a class name and in dead code).
``ALLOCATION_LINES`` maps each release line to the model whose allocations it has, with the reason.
"""

from __future__ import annotations

from memfit.errors import MemfitError

ALLOCATION_LINES: dict[str, tuple[str, str]] = {
    "0.5": ("0.5", "read: 0.5.8 and 0.5.10 sources"),
    "0.6": ("0.6", "read: 0.6.x source"),
    **{f"0.{m}": ("0.19", "the 0.19.8 source read; the ZeRO allocation code memfit models is unchanged since 0.13")
       for m in range(13, 20)},
}
"""release line -> (allocation model, why)."""


def allocation_line(release: str | None, *, where: str = "--deepspeed-version") -> str:
    """The allocation model of a DeepSpeed release line (None, DeepSpeed not installed: 0.19, unused)."""
    if release is None:
        return "0.19"
    hit = ALLOCATION_LINES.get(release)
    if hit is None:
        known = ", ".join(sorted(ALLOCATION_LINES, key=lambda v: int(v.split(".")[1])))
        raise MemfitError(f"{where}: DeepSpeed {release}.x's allocations are not modelled; memfit models DeepSpeed "
                          f"{known}")
    return hit[0]


def allocation_reason(release: str | None) -> str:
    return "" if release is None else ALLOCATION_LINES[release][1]
