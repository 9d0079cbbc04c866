"""An allocation tracker for fake (or real) tensors: every live storage, its category and module.

``AllocationTracker`` is a ``TorchDispatchMode`` stacked above ``FakeTensorMode``: each aten op's
outputs are inspected, a storage not seen before is an allocation, and a ``weakref`` callback on the
storage object marks its release (torch keeps one Python object per live storage, so the callback
fires exactly when the last tensor or view of it dies). Categories change as the step goes:
``saved_tensors_hooks`` pack calls turn temporaries into *saved*, post-accumulate-grad hooks turn
them into *gradients*; module forward hooks keep a module stack, and autograd nodes are tagged with
the module that created them (a ``TorchFunctionMode``), so backward allocations are attributed to
the module whose node runs (``torch._C._current_autograd_node``).

Why not ``torch.distributed._tools.MemTracker``: it registers gradient hooks on every parameter and
raises on frozen ones, and it does not separate saved tensors from temporaries.

Everything is logged as compact events; ``replay_log`` recomputes what was live at any instant
(the peaks) in one pass, so tracking itself stays cheap.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from functools import partial

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from memfit.trace.results import CATEGORIES

PARAM_TRAINABLE, PARAM_FROZEN, BUFFER, INPUT, GRADIENT, SAVED, OUTPUT, HELD, TEMPORARY, PARAM_CAST = range(len(CATEGORIES))
_ACTIVATION_SIDE = frozenset({INPUT, SAVED, OUTPUT, HELD, TEMPORARY})
_REASSIGNABLE = frozenset({TEMPORARY, OUTPUT, HELD})

_PARAMS = frozenset({PARAM_TRAINABLE, PARAM_FROZEN})
_TO_COPY = torch.ops.aten._to_copy.default

# log record kinds
ALLOC, FREE, RECAT = 0, 1, 2

NO_MODULE = -1
_META_KEY = "memfit_module"


def round_up(nbytes: int, granularity: int) -> int:
    """Bytes the CUDA caching allocator hands out for a request (``round_size``: at least one
    512 B block, then multiples of 512 B; c10/cuda/CUDACachingAllocator.cpp)."""
    if granularity <= 1 or nbytes == 0:  # an empty tensor allocates nothing
        return nbytes
    return max(granularity, -(-nbytes // granularity) * granularity)


class AllocationTracker(TorchDispatchMode):
    """Tracks live storages; enter it inside ``FakeTensorMode`` (or alone, on real tensors).

    Phases: ``set_phase(0)`` forward, ``set_phase(1)`` backward; peaks are tracked per phase.
    """

    def __init__(self, *, granularity_bytes: int = 512) -> None:
        super().__init__()
        self._granularity = granularity_bytes
        self._live: dict[int, list] = {}  # key -> [bytes, category, module]
        self._refs: dict[int, weakref.ref] = {}
        self.log: list[tuple] = []
        self.totals = [0] * len(CATEGORIES)
        self.current = 0
        self.act = 0
        self._seg_max = 0
        self.phase = -1
        self.peak = [0, 0]
        self.peak_at = [0, 0]
        self.events: list[tuple[str, int, int, int, int]] = []  # (kind, module, param, act, act_peak)
        self.marks: list[tuple[int, int]] = []
        """(log position, code) in call order: code >= 0 is the index of an event, -1 - p a ``set_phase(p)``
        (``memfit.trace.layer_reuse`` rebuilds a log from them)."""
        self.stack: list[int] = []
        self._node = None
        self._node_module = NO_MODULE
        self.autocast_dtype: torch.dtype | None = None
        """Set while tracing under autocast: its copies of fp32 weights are counted as ``param_cast``."""

    # ---------------------------------------------------------------- bookkeeping
    def track(self, storage: torch.UntypedStorage, category: int, module: int, op: object = None) -> None:
        """Count ``storage`` as allocated now (no-op if it is already live)."""
        key = id(storage)
        if key in self._live:
            return
        nbytes = round_up(storage.nbytes(), self._granularity)
        self._live[key] = [nbytes, category, module]
        self._refs[key] = weakref.ref(storage, partial(self._release, key))
        self.log.append((ALLOC, key, nbytes, category, module, op))
        self.totals[category] += nbytes
        self.current += nbytes
        if category in _ACTIVATION_SIDE:
            self.act += nbytes
            if self.act > self._seg_max:
                self._seg_max = self.act
        phase = self.phase
        if phase >= 0 and self.current > self.peak[phase]:
            self.peak[phase] = self.current
            self.peak_at[phase] = len(self.log)

    def _release(self, key: int, _ref: object = None) -> None:
        entry = self._live.pop(key, None)
        self._refs.pop(key, None)
        if entry is None:
            return
        nbytes, category, _ = entry
        self.log.append((FREE, key))
        self.totals[category] -= nbytes
        self.current -= nbytes
        if category in _ACTIVATION_SIDE:
            self.act -= nbytes

    def recategorize(self, storage: torch.UntypedStorage, category: int, *, only_from: frozenset | None = None,
                     module: int = NO_MODULE) -> None:
        """Move a live storage to ``category`` (tracking it first if it was never seen)."""
        key = id(storage)
        if key not in self._live:
            self.track(storage, category, module)
            return
        self.recategorize_key(key, category, only_from=only_from)

    def recategorize_key(self, key: int, category: int, *, only_from: frozenset | None = None) -> None:
        """Move the live storage ``key`` (from ``live_items``) to ``category``."""
        entry = self._live.get(key)
        if entry is None:
            return
        old = entry[1]
        if old == category or (only_from is not None and old not in only_from):
            return
        nbytes = entry[0]
        entry[1] = category
        self.log.append((RECAT, key, category))
        self.totals[old] -= nbytes
        self.totals[category] += nbytes
        was_act, is_act = old in _ACTIVATION_SIDE, category in _ACTIVATION_SIDE
        if was_act and not is_act:
            self.act -= nbytes
        elif is_act and not was_act:
            self.act += nbytes
            if self.act > self._seg_max:
                self._seg_max = self.act

    def live_items(self) -> Iterable[tuple[int, int, int, int]]:
        """(key, bytes, category, module) of every live storage."""
        return ((k, v[0], v[1], v[2]) for k, v in list(self._live.items()))

    def set_phase(self, phase: int) -> None:
        self.marks.append((len(self.log), -1 - phase))
        self.phase = phase
        self.peak[phase] = self.current
        self.peak_at[phase] = len(self.log)

    def event(self, kind: str, module: int = NO_MODULE, param: int = -1) -> None:
        """Close the current segment with a named event (module order for ZeRO-3)."""
        self.marks.append((len(self.log), len(self.events)))
        self.events.append((kind, module, param, self.act, self._seg_max))
        self._seg_max = self.act

    # ---------------------------------------------------------------- attribution
    def current_module(self) -> int:
        if self.stack:
            return self.stack[-1]
        if self.phase == 1:
            node = torch._C._current_autograd_node()
            if node is not None and node is not self._node:
                self._node = node
                module = node.metadata.get(_META_KEY, NO_MODULE)
                if module != NO_MODULE and module != self._node_module:
                    self.event("node", module)
                self._node_module = module if module != NO_MODULE else self._node_module
            return self._node_module
        return NO_MODULE

    # ---------------------------------------------------------------- dispatch
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if type(out) is tuple or type(out) is list:
            module = None
            for t in out:
                if isinstance(t, torch.Tensor):
                    if module is None:
                        module = self.current_module()
                    for st in storages(t):
                        self.track(st, TEMPORARY, module, func)
        elif isinstance(out, torch.Tensor) and out.layout != torch.strided:
            module = self.current_module()
            for st in storages(out):
                self.track(st, TEMPORARY, module, func)
        elif isinstance(out, torch.Tensor):
            category = TEMPORARY
            if (func is _TO_COPY and self.autocast_dtype is not None and out.dtype == self.autocast_dtype
                    and isinstance(args[0], torch.Tensor) and args[0].dtype == torch.float32):
                src = self._live.get(id(args[0].untyped_storage()))
                if src is not None and src[1] in _PARAMS:  # autocast's copy of an fp32 weight (cached_cast)
                    category = PARAM_CAST
            self.track(out.untyped_storage(), category, self.current_module(), func)
        return out

    # ---------------------------------------------------------------- autograd hooks
    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        """``saved_tensors_hooks`` pack hook: the tensor itself (no copy), noted as saved."""
        for st in storages(tensor):
            self.recategorize(st, SAVED, only_from=_REASSIGNABLE,
                              module=self.stack[-1] if self.stack else self._node_module)
        return tensor

    @staticmethod
    def unpack(tensor: torch.Tensor) -> torch.Tensor:
        return tensor


class NodeTagger(TorchFunctionMode):
    """Tags each autograd node with the module on top of ``tracker.stack`` when it is created."""

    def __init__(self, tracker: AllocationTracker) -> None:
        super().__init__()
        self._tracker = tracker

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        stack = self._tracker.stack
        if stack:
            if isinstance(out, torch.Tensor):
                tag_node(out, stack[-1])
            elif type(out) is tuple or type(out) is list:
                for t in out:
                    if isinstance(t, torch.Tensor):
                        tag_node(t, stack[-1])
        return out


def storages(t: torch.Tensor) -> tuple[torch.UntypedStorage, ...]:
    """The storages a tensor holds: its own (strided), a sparse COO tensor's indices and values (SHiRA's
    delta weight), none for other layouts."""
    if t.layout == torch.strided:
        return (t.untyped_storage(),)
    if t.layout == torch.sparse_coo:
        return (t._indices().untyped_storage(), t._values().untyped_storage())
    return ()


def tag_node(tensor: torch.Tensor, module: int) -> None:
    """Record ``module`` on the autograd node that made ``tensor`` (first tag wins)."""
    fn = tensor.grad_fn
    if fn is not None:
        meta = fn.metadata
        if _META_KEY not in meta:
            meta[_META_KEY] = module


def replay_log(log: list[tuple], targets: Iterable[int]) -> dict[int, dict[int, list]]:
    """What was live after ``log[:t]`` for each ``t`` in ``targets``: {t: {key: [bytes, cat, module]}}."""
    wanted = sorted(set(targets))
    out: dict[int, dict[int, list]] = {}
    live: dict[int, list] = {}
    i = 0
    for t in wanted:
        while i < t:
            rec = log[i]
            kind = rec[0]
            if kind == ALLOC:
                live[rec[1]] = [rec[2], rec[3], rec[4], rec[5]]
            elif kind == FREE:
                live.pop(rec[1], None)
            else:
                entry = live.get(rec[1])
                if entry is not None:
                    entry[1] = rec[2]
            i += 1
        out[t] = {k: list(v) for k, v in live.items()}
    return out
