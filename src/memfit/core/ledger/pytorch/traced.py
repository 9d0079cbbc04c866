"""``memfit plan --exact`` outside DeepSpeed: a traced step's activations booked stage by stage.

The trace (``memfit.trace``) reports what each module's code had allocated and was still live at the
forward peak (``TracedStep.by_module``). The torch/DDP/FSDP/FSDP2 recipes keep their own loop
(embeddings, each block, the head; gradients and frees stage by stage in backward), so each module's
bytes go to the stage of the params it holds: a module under one block to that block, a module that
spans several stages (the root, the decoder stack: the causal mask, the loss) and code outside any
module to the last stage they span, i.e. the head. The temporaries alive at the peak (the loss's,
when the peak is the loss) live while the peak's stage runs and are freed there.
"""

from __future__ import annotations


from memfit.core.lean_dataclass import dataclass
from memfit.core.ledger_types import TracedStep


@dataclass(frozen=True, slots=True)
class TracedStages:
    kept: tuple[int, ...]
    """Per stage: saved, outputs, held and inputs at the forward peak (freed in backward with the stage)."""
    temporary: int
    """The peak's temporaries, alive while ``temporary_stage`` runs."""
    temporary_stage: int


def stage_of_modules(param_names: list[str], stages: list[int]) -> dict[str, tuple[int, int]]:
    """Each module prefix of ``param_names`` -> (lowest, highest) stage of the params under it."""
    span: dict[str, tuple[int, int]] = {}
    for name, st in zip(param_names, stages):
        parts = name.split(".")[:-1]
        for k in range(len(parts) + 1):
            prefix = ".".join(parts[:k])
            lo, hi = span.get(prefix, (st, st))
            span[prefix] = (min(lo, st), max(hi, st))
    return span


def _stage(module: str, span: dict[str, tuple[int, int]], last: int) -> int:
    if module in ("<outside modules>", "<root>"):
        return last
    m = module
    while m not in span:
        if "." not in m:
            return last
        m = m.rsplit(".", 1)[0]
    return span[m][1]


def traced_stages(traced: TracedStep, param_names: list[str], stages: list[int], n_stages: int) -> TracedStages:
    """``traced``'s forward-peak bytes per stage of the torch loop (``stages[k]``: the stage of
    ``param_names[k]``)."""
    span = stage_of_modules(param_names, stages)
    last = n_stages - 1
    kept = [0] * n_stages
    temporary, temp_stage, temp_top = 0, last, -1
    for row in traced.by_module:
        st = _stage(row.module, span, last)
        kept[st] += row.kept_bytes
        temporary += row.temporary_bytes
        if row.temporary_bytes > temp_top:
            temp_stage, temp_top = st, row.temporary_bytes
    return TracedStages(kept=tuple(kept), temporary=temporary, temporary_stage=temp_stage)
