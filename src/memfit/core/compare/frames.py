"""Which ledger item an allocation belongs to, read from its stack frames.

Two kinds of rule, each ``(file, function) -> ledger keys``:

1. *ledger rules*, read from the ``source`` of every GPU item of the plan: the same
   ``file.py:function`` a ledger item cites as the library code it mirrors (``deepspeed/runtime/
   zero/stage3.py:_create_fp16_partitions_with_defragmentation -> utils.py:defragment`` gives two
   rules). A rule whose file is a bare name (``engine.py``) matches that file in any package.
2. *memfit rules* (``EXTRA_RULES``) for items whose source names no Python function: activations
   created inside a model's ``forward``, gradients accumulated by autograd's ``AccumulateGrad``,
   optimizer states created by ``torch.optim``/DeepSpeed's Adam at their first ``step``.

An allocation's frames are read innermost first; the first frame any rule matches decides (ledger
rules before memfit rules at the same frame). Items that cite the same function (``move.params`` and
``move.buffers`` both cite ``_configure_distributed_model``) cannot be told apart by frames: the
allocation goes to the group of both keys, compared with the sum of their planned bytes.
"""

from __future__ import annotations

import re

from memfit.core.lean_dataclass import dataclass
from memfit.core.ledger_types import Device, Plan
from memfit.core.records.types import StackFrame

_CITE = re.compile(r"(?P<file>[A-Za-z0-9_./-]+\.py):(?P<func>[A-Za-z_][A-Za-z0-9_.]*)")


@dataclass(frozen=True, slots=True)
class FrameRule:
    keys: tuple[str, ...]
    file: str
    """Path suffix (``deepspeed/runtime/zero/stage3.py``) or ``*`` for any file; ``/``-separated."""
    function: str
    """Function name, or a substring of it when ``contains`` (C++ frames: ``AccumulateGrad``)."""
    origin: str
    """``ledger: <source>`` or ``memfit: <why>``."""
    contains: bool = False
    file_contains: bool = False
    """``file`` is a substring of the path (``/transformers/models/``), not a suffix."""
    generic: bool = False
    """A catch-all for code that calls into libraries (a model's forward, autograd's backward): it
    does not claim an allocation made deeper inside DeepSpeed, peft, bitsandbytes or accelerate code
    that no rule names (that one is the library's own, and unplanned)."""

    def matches(self, frame: StackFrame) -> bool:
        path = frame.filename.replace("\\", "/")
        name = frame.name.rsplit(".", 1)[-1] if not self.contains else frame.name
        if self.contains:
            if self.function not in name:
                return False
        elif name != self.function:
            return False
        if self.file == "*":
            return True
        if self.file_contains:
            return self.file in path
        return path == self.file or path.endswith("/" + self.file)

    def describe(self) -> str:
        fn = f"*{self.function}*" if self.contains else self.function
        file = f"*{self.file}*" if self.file_contains else self.file
        return f"{file}:{fn} -> {', '.join(self.keys)}  ({self.origin})"


EXTRA_RULES: tuple[FrameRule, ...] = (
    FrameRule(("step.full_gradient",), "*", "AccumulateGrad", contains=True,
              origin="memfit: autograd's AccumulateGrad creates param.grad (torch/csrc/autograd/functions/accumulate_grad.h)"),
    FrameRule(("optimizer.states",), "/torch/optim/", "_init_group", file_contains=True,
              origin="memfit: torch.optim creates its state tensors lazily in _init_group at the first step()"),
    FrameRule(("optimizer.states",), "/torch/optim/", "step", file_contains=True,
              origin="memfit: torch.optim state created or updated inside step()"),
    FrameRule(("optimizer.states",), "deepspeed/ops/adam/fused_adam.py", "step",
              origin="memfit: DeepSpeed FusedAdam creates exp_avg/exp_avg_sq at its first step()"),
    FrameRule(("step.activations",), "deepspeed/runtime/zero/linear.py", "forward",
              origin="memfit: ZeRO-3's memory-efficient Linear saves its input for backward (in the activation estimate)"),
    FrameRule(("step.activations",), "deepspeed/runtime/zero/linear.py", "backward",
              origin="memfit: ZeRO-3's memory-efficient Linear's backward (activation gradients)"),
    FrameRule(("step.activations",), "/transformers/models/", "forward", file_contains=True,
              origin="memfit: tensors a transformers model's forward creates (activations and temporaries)", generic=True),
    FrameRule(("step.activations",), "/peft/tuners/", "forward", file_contains=True,
              origin="memfit: tensors a PEFT layer's forward creates", generic=True),
    FrameRule(("step.activations",), "/torch/nn/modules/", "forward", file_contains=True,
              origin="memfit: tensors a torch.nn module's forward creates", generic=True),
    FrameRule(("step.activations",), "torch/autograd/__init__.py", "backward",
              origin="memfit: autograd's engine during backward (activation gradients and temporaries; "
                     "AccumulateGrad frames, when recorded, go to step.full_gradient first)", generic=True),
    FrameRule(("step.activations",), "torch/autograd/graph.py", "_engine_run_backward",
              origin="memfit: autograd's engine during backward", generic=True),
)


def plan_rules(plan: Plan) -> tuple[FrameRule, ...]:
    """Rules from the ``source`` of every GPU item the plan has, in any phase."""
    cites: dict[tuple[str, str], set[str]] = {}
    sources: dict[tuple[str, str], str] = {}
    for ph in plan.phases:
        for it in ph.items:
            if it.device is not Device.GPU:
                continue
            for m in _CITE.finditer(it.source):
                file, func = m.group("file"), m.group("func").rsplit(".", 1)[-1]
                cites.setdefault((file, func), set()).add(it.key)
                sources.setdefault((file, func), it.source)
    return tuple(FrameRule(tuple(sorted(keys)), file, func, origin=f"ledger: {sources[(file, func)]}")
                 for (file, func), keys in sorted(cites.items()))


class FrameReader:
    """Attributes frame stacks to ledger keys, remembering each distinct stack's answer."""

    def __init__(self, plan: Plan) -> None:
        self.ledger = plan_rules(plan)
        self.extra = EXTRA_RULES
        self._by_func: dict[str, list[FrameRule]] = {}
        self._contains: list[FrameRule] = []
        for rank, rules in ((0, self.ledger), (1, self.extra)):
            for r in rules:
                if r.contains:
                    self._contains.append(r)
                else:
                    self._by_func.setdefault(r.function, []).append(r)
        self._order = {id(r): (0 if r in self.ledger else 1) for r in (*self.ledger, *self.extra)}
        self._memo: dict[int, tuple[tuple[str, ...] | None, tuple[StackFrame, ...]]] = {}
        self._shorts: dict[int, tuple[StackFrame, str]] = {}
        self._sites: dict[int, tuple[str, tuple[StackFrame, ...]]] = {}
        self._frames: dict[int, tuple[StackFrame, tuple[FrameRule, ...], bool]] = {}
        self._site_of: dict[int, tuple[StackFrame, _Site]] = {}

    def _site(self, frame: StackFrame) -> _Site:
        """``_site_of(frame)``, once per frame object."""
        hit = self._site_of.get(id(frame))
        if hit is not None and hit[0] is frame:
            return hit[1]
        site = _site_of(frame, self.short)
        self._site_of[id(frame)] = (frame, site)
        return site

    def _frame(self, frame: StackFrame) -> tuple[tuple[FrameRule, ...], bool]:
        """(the rules that match ``frame``, whether it is a library's own code), once per frame object:
        a snapshot's distinct stacks share a few thousand frames, and the comparison walks 300,000 stacks."""
        hit = self._frames.get(id(frame))
        if hit is not None and hit[0] is frame:
            return hit[1], hit[2]
        found = tuple([r for r in self._by_func.get(frame.name.rsplit(".", 1)[-1], ()) if r.matches(frame)]
                      + [r for r in self._contains if r.matches(frame)])
        own = _in_library(frame, self.short)
        self._frames[id(frame)] = (frame, found, own)
        return found, own

    def short(self, frame: StackFrame) -> str:
        """``frame.short()``, computed once per frame object (a snapshot's stacks share their frames)."""
        hit = self._shorts.get(id(frame))
        if hit is not None and hit[0] is frame:
            return hit[1]
        text = frame.short()
        self._shorts[id(frame)] = (frame, text)
        return text

    def where(self, frames: tuple[StackFrame, ...]) -> str:
        """``where(frames)``, once per distinct stack."""
        hit = self._sites.get(id(frames))
        if hit is not None and hit[1] is frames:
            return hit[0]
        site = _where(frames, self._site)
        self._sites[id(frames)] = (site, frames)
        return site

    def keys_for(self, frames: tuple[StackFrame, ...]) -> tuple[str, ...] | None:
        """The ledger keys of the innermost frame a rule matches; ``None`` when none does."""
        hit = self._memo.get(id(frames))
        if hit is not None and hit[1] is frames:
            return hit[0]
        result = None
        passed_library = False
        for frame in frames:
            found, own = self._frame(frame)
            if passed_library:
                found = [r for r in found if not r.generic]
            if not found and own:
                passed_library = True
            if found:
                best = min(self._order[id(r)] for r in found)
                keys = sorted({k for r in found if self._order[id(r)] == best for k in r.keys})
                result = tuple(keys)
                break
        self._memo[id(frames)] = (result, frames)
        return result

    def describe(self) -> tuple[str, ...]:
        return tuple(r.describe() for r in (*self.ledger, *self.extra))


_OWN_CODE = ("deepspeed/", "peft/", "bitsandbytes/", "accelerate/")
"""Libraries whose own allocations the ledger models item by item (a generic rule never claims them)."""


def _in_library(frame: StackFrame, short=StackFrame.short) -> bool:
    return frame.filename.endswith(".py") and short(frame).startswith(_OWN_CODE)


_INTERNAL = ("torch/nn/modules/module.py", "torch/utils/", "torch/_tensor.py", "torch/autograd/",
             "torch/_ops.py", "torch/overrides.py", "torch/_compile.py", "torch/_dynamo/")
_LIBRARIES = ("deepspeed/", "transformers/", "peft/", "accelerate/", "bitsandbytes/", "trl/", "torch/optim/",
              "torch/distributed/")


@dataclass(frozen=True, slots=True)
class _Site:
    """What ``where`` reads of one frame."""
    python: bool
    short: str
    library: bool
    internal: bool


def _site_of(frame: StackFrame, short=StackFrame.short) -> _Site:
    if not frame.filename.endswith(".py"):
        return _Site(False, "", False, False)
    text = short(frame)
    path = frame.filename.replace("\\", "/")
    return _Site(True, text, text.startswith(_LIBRARIES), any(part in path for part in _INTERNAL))


def where(frames: tuple[StackFrame, ...], short=StackFrame.short) -> str:
    """A short name for an allocation site: the innermost frame of a library memfit models (DeepSpeed,
    transformers, peft, ...), else the innermost Python frame outside torch's plumbing."""
    return _where(frames, lambda f: _site_of(f, short))


def _where(frames: tuple[StackFrame, ...], site) -> str:
    py = [s for s in map(site, frames) if s.python]
    for s in py:
        if s.library:
            return s.short
    for s in py:
        if not s.internal:
            return s.short
    if py:
        return py[0].short
    if frames:
        return frames[0].name[:80]
    return "(no stack recorded)"
