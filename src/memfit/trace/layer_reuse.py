"""Trace a deep model's identical layers once and reuse them: the N-layer step's log from a 5-layer one.

A decoder's layers run the same code on the same shapes, so each layer's stretch of the tracker's log
(its allocations, frees and recategorizations, its module events, forward and backward) is the same as
its neighbour's with the layer number shifted. ``reused_record`` traces the model with each layer
stack cut to its first 5 layers and to its first 6 (every module outside the stacks is the N-layer
model's own) and reads the 5-layer log as a template: what comes before, between and after the stacks
once, the first two layers and the last two as they are, and the middle one repeated for every other
layer. It writes the template out for 6 layers and compares that, record by record, with the 6-layer
trace; only when they are equal does it write the template out for N layers, and the ``TraceResult``
comes from that log through the same ``record.trace_result`` a full trace uses.

A reference from one layer's stretch to another's tensor (the previous layer's output, freed in this
layer's forward; the next layer's gradient in backward) keeps its distance in layers, and reaches the
same allocation of the layer it lands on (aligned by ``_aligned`` where that layer is written from
another template layer); a reference to a tensor outside the stacks moves with the layer by the stride
its neighbours show (0 for the rotary tables every layer reads); a reference from outside the stacks
reaches one of the first or last two layers; a pass over every layer from outside them (the forward's
end marking each layer's kept input as *held* under gradient checkpointing) is a sweep, repeated per
layer. Anything else, and any difference in the 6-layer check, falls back to the full trace, as do
layers that are not identical: a per-layer list in the config whose values differ (``layer_types``:
sliding and full attention), layers 1..N-1 that differ in their modules, params, buffers or scalar
attributes (layer 0 may differ: T5's first block holds the relative position bias), and peft's prefix
tuning (outside the stacks, the cut layers' slices of the prefix get zero gradients).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from memfit.trace import tracker as tk
from memfit.trace.record import StepRecord

TEMPLATE_LAYERS = 5
"""Layers per stack in the template trace: the first two, one repeated, the last two. The repeated layer
has a layer like it on either side (the first layer may differ, as T5's first block, and so may what a
layer hands the last one)."""
CHECK_LAYERS = TEMPLATE_LAYERS + 1
"""Layers per stack in the trace the template is checked against."""
MIN_LAYERS = 20
"""Reuse only when the stacks hold at least this many layers in all (below it the two short traces,
11 layers per stack, cost about as much as the full one)."""
_ACT = frozenset({tk.INPUT, tk.SAVED, tk.OUTPUT, tk.HELD, tk.TEMPORARY})


class NotReusable(Exception):
    """Why a log cannot be written out for N layers (the caller traces the full model)."""


@dataclass(frozen=True, slots=True)
class LayerStack:
    """One ``ModuleList`` of layers: its ``named_modules`` name and its length."""

    prefix: str
    layers: int


@dataclass(frozen=True, slots=True)
class ReuseDecision:
    stacks: tuple[LayerStack, ...]
    """The stacks to cut (empty: trace the full model)."""
    reason: str
    """Why the full model is traced ("" when reusing)."""


# ------------------------------------------------------------------------------------ which layers
def layer_stacks(model: Any, min_len: int = CHECK_LAYERS + 1) -> tuple[LayerStack, ...]:
    """The outermost ``ModuleList``s of at least ``min_len`` modules (a decoder's layers, T5's blocks)."""
    import torch

    found: list[LayerStack] = []
    for name, module in model.named_modules():
        if type(module) is torch.nn.ModuleList and len(module) >= min_len:
            if not any(name.startswith(s.prefix + ".") for s in found):
                found.append(LayerStack(prefix=name, layers=len(module)))
    return tuple(found)


def decide(model: Any, *, min_layers: int = MIN_LAYERS) -> ReuseDecision:
    """Whether ``model``'s trace can be written out from a 5-layer one, and which stacks to cut."""
    stacks = layer_stacks(model)
    total = sum(s.layers for s in stacks)
    if not stacks or total < min_layers:
        return ReuseDecision((), f"{total} layers in stacks of {CHECK_LAYERS + 1} or more (reuse from {min_layers})")
    kinds = {str(getattr(c, "peft_type", "")) for c in (getattr(model, "peft_config", None) or {}).values()}
    if any(k.endswith("PREFIX_TUNING") for k in kinds):
        return ReuseDecision((), "peft's prefix tuning hands each layer its slice of one prefix tensor, and the "
                                 "layers a short trace cuts get zero gradients outside the stacks")
    for s in stacks:
        varying = _varying_config_list(getattr(model, "config", None), s.layers)
        if varying:
            return ReuseDecision((), f"the config's {varying} differs from layer to layer")
        layers = list(model.get_submodule(s.prefix))
        first = _signature(layers[1])
        for i, layer in enumerate(layers[2:], start=2):
            if not _same_layer(first, _signature(layer), i):
                return ReuseDecision((), f"{s.prefix}.{i} differs from {s.prefix}.1")
    return ReuseDecision(stacks, "")


def _varying_config_list(config: Any, n: int) -> str:
    """The name of a per-layer list of the config (n entries) whose entries differ, or ""."""
    seen: list[Any] = [config] if config is not None else []
    for sub in ("text_config", "decoder", "encoder"):
        inner = getattr(config, sub, None)
        if inner is not None and hasattr(inner, "to_dict"):
            seen.append(inner)
    for c in seen:
        for key, value in vars(c).items():
            if isinstance(value, (list, tuple)) and len(value) == n and len({repr(v) for v in value}) > 1:
                return key
    return ""


def _signature(layer: Any) -> tuple:
    """A layer's modules (classes and scalar attributes), params and buffers (shapes, dtypes, trainable)."""
    rows: list[tuple] = []
    for name, module in layer.named_modules():
        attrs = tuple(sorted((k, v) for k, v in vars(module).items()
                             if not k.startswith("_") and (v is None or type(v) in (bool, int, float, str))))
        rows.append((name, type(module).__name__, attrs))
    rows += [(n, tuple(p.shape), str(p.dtype), p.requires_grad) for n, p in layer.named_parameters()]
    rows += [(n, tuple(b.shape), str(b.dtype)) for n, b in layer.named_buffers()]
    return tuple(rows)


def _same_layer(first: tuple, other: tuple, index: int) -> bool:
    """Layer ``index`` is layer 1 but for attributes holding the layer's own index (``layer_idx``)."""
    if len(first) != len(other):
        return False
    for a, b in zip(first, other):
        if a == b:
            continue
        if len(a) != 3 or a[:2] != b[:2] or len(a[2]) != len(b[2]):
            return False
        for (ka, va), (kb, vb) in zip(a[2], b[2]):
            if ka != kb or (va != vb and not (type(va) is int and type(vb) is int and va == 1 and vb == index)):
                return False
    return True


class cut_stacks:
    """Context: each stack holds only its first ``k`` layers (the same module objects)."""

    def __init__(self, model: Any, stacks: tuple[LayerStack, ...], k: int) -> None:
        self.model, self.stacks, self.k = model, stacks, k
        self.saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> None:
        import torch

        for s in self.stacks:
            parent_name, _, attr = s.prefix.rpartition(".")
            parent = self.model.get_submodule(parent_name)
            full = getattr(parent, attr)
            self.saved.append((parent, attr, full))
            setattr(parent, attr, torch.nn.ModuleList(list(full)[: self.k]))

    def __exit__(self, *exc: object) -> None:
        for parent, attr, full in reversed(self.saved):
            setattr(parent, attr, full)


# ------------------------------------------------------------------------------------ the log as items
def _items(record: StepRecord) -> list[tuple]:
    """The record's log and marks as one sequence, instances numbered in allocation order (a storage's
    id is reused once it dies), modules and params by name:
    ("A", inst, bytes, category, module, op), ("F", inst), ("R", inst, category),
    ("E", kind, module, param), ("P", phase)."""
    names, pnames = record.names, [p.name for p in record.params]
    out: list[tuple] = []
    live: dict[int, int] = {}
    allocated = 0
    marks, m = record.marks, 0
    for i, rec in enumerate([*record.log, None]):
        while m < len(marks) and marks[m][0] == i:
            code = marks[m][1]
            if code < 0:
                out.append(("P", -1 - code))
            else:
                kind, module, param, _act, _peak = record.events[code]
                out.append(("E", kind, names[module] if module >= 0 else None, pnames[param] if param >= 0 else None))
            m += 1
        if rec is None:
            break
        if rec[0] == tk.ALLOC:
            inst = live[rec[1]] = allocated
            allocated += 1
            out.append(("A", inst, rec[2], rec[3], names[rec[4]] if rec[4] >= 0 else None, rec[5]))
        elif rec[0] == tk.FREE:
            out.append(("F", live.pop(rec[1])))
        else:
            out.append(("R", live[rec[1]], rec[2]))
    return _sorted_frees(out)


def _sorted_frees(items: list[tuple]) -> list[tuple]:
    """``items`` with each run of consecutive frees in allocation order. Storages released together
    (autocast's cast cache emptied at the end of the region, a C++ hash map keyed by address) die in an
    order no figure depends on (between two frees nothing is allocated, marked or counted) and that
    differs from run to run."""
    out: list[tuple] = []
    i = 0
    while i < len(items):
        if items[i][0] != "F":
            out.append(items[i])
            i += 1
            continue
        j = i
        while j < len(items) and items[j][0] == "F":
            j += 1
        out.extend(sorted(items[i:j], key=lambda it: it[1]))
        i = j
    return out


# ------------------------------------------------------------------------------------ the template
Where = tuple[str, int, str]
"""(stack prefix, layer, the rest of the name) of a module or param inside a stack."""


class _Names:
    """Splits module and param names by stack (memoized)."""

    def __init__(self, stacks: tuple[LayerStack, ...]) -> None:
        self.prefixes = tuple(s.prefix + "." for s in stacks)
        self.memo: dict[str, Where | None] = {}

    def split(self, name: str | None) -> Where | None:
        if name is None:
            return None
        if name in self.memo:
            return self.memo[name]
        found = None
        for p in self.prefixes:
            if name.startswith(p):
                head, _, rest = name[len(p):].partition(".")
                if head.isdigit():
                    found = (p[:-1], int(head), rest)
                    break
        self.memo[name] = found
        return found


@dataclass(frozen=True, slots=True)
class _Segment:
    stack: str | None
    """None: items outside the stacks, written once; else a group of one stretch per layer."""
    ascending: bool
    runs: tuple[tuple[tuple, ...], ...]
    """Static: one run; a group: the stretch of layer 0, 1 ... TEMPLATE_LAYERS - 1."""


@dataclass(frozen=True, slots=True)
class _Template:
    segments: tuple[_Segment, ...]
    homes: dict[int, tuple[int, int | None, int]]
    """Instance -> (segment, layer or None, its allocation's ordinal in that stretch)."""
    signatures: dict[tuple[int, int | None, int], tuple]
    counts: dict[tuple[int, int | None], int]
    """Allocations per (segment, layer)."""
    alignments: dict[tuple[int, int, int], dict[int, int]]
    """Memo of ``_aligned``."""
    strides: dict[tuple[int, int], tuple[int, ...]]
    """Per (segment, layer), for each of its references to a tensor outside the stacks in turn: how many
    allocations further that tensor is one layer on (peft's prefix: each layer takes its own slice of the
    prefix; 0: the same tensor for every layer, as the rotary tables)."""
    families: tuple[tuple[str, int, int, int], ...]
    """(stack, segment, ordinal for layer 0, stride) of each such per-layer run of tensors outside the stacks."""


def _labels(items: list[tuple], names: _Names) -> list[tuple | None]:
    """Each item's stretch: (stack, layer, is_sweep) or None (outside the stacks).

    Registration: a param's or buffer's owner. Forward: from a layer's ``fwd_pre`` until a module outside
    the stacks runs with no layer open. Backward: the module of the last event (autograd node, grad,
    recompute). Outside the stacks, a free or recategorization of a layer's tensor starts a sweep's
    stretch of that layer, which runs until the next one, a layer's own stretch or the next phase (peft's
    prefix: the root's per-layer slices of the prefix gradient)."""
    phase, cur, open_ = -1, None, False
    home_layer: dict[int, tuple[str, int]] = {}
    out: list[tuple | None] = []
    sweep: tuple | None = None
    for it in items:
        kind = it[0]
        if kind == "P":
            phase, cur, open_, sweep = it[1], None, False, None
            out.append(None)
            continue
        if kind == "E":
            where = names.split(it[2])
            if phase == 0:
                if where is not None and where[2] == "" and it[1] == "fwd_pre":
                    cur, open_ = where[:2], True
                elif where is not None and where[2] == "" and it[1] == "fwd_post":
                    open_ = False
                elif where is None and not open_:
                    cur = None
            else:
                cur = where[:2] if where is not None else None
        elif kind == "A" and phase == -1:
            where = names.split(it[4])
            if where is not None:
                home_layer[it[1]] = where[:2]
                out.append((*where[:2], False))
                continue
        label = None if cur is None else (*cur, False)
        if label is not None:
            sweep = None
            if kind == "A":
                home_layer[it[1]] = cur
        elif kind in ("F", "R") and phase >= 0 and it[1] in home_layer:
            sweep = (*home_layer[it[1]], True)
        out.append(label if label is not None else sweep)
    return out


def _template(items: list[tuple], names: _Names, k: int = TEMPLATE_LAYERS) -> _Template:
    labels = _labels(items, names)
    runs: list[tuple[tuple | None, list[tuple]]] = []
    for label, it in zip(labels, items):
        if runs and runs[-1][0] == label:
            runs[-1][1].append(it)
        else:
            runs.append((label, [it]))
    segments: list[_Segment] = []
    i = 0
    while i < len(runs):
        label, run = runs[i]
        if label is not None:
            stack, j, sweep = label
            order = list(range(k)) if j == 0 else list(range(k - 1, -1, -1)) if j == k - 1 else None
            if order is not None and i + k <= len(runs) and all(
                    runs[i + o][0] == (stack, jj, sweep) for o, jj in enumerate(order)):
                by_layer = {jj: tuple(runs[i + o][1]) for o, jj in enumerate(order)}
                segments.append(_Segment(stack, order[0] == 0, tuple(by_layer[jj] for jj in range(k))))
                i += k
                continue
            if not sweep:
                raise NotReusable(f"layer {j} of {stack} runs out of order ({', '.join(str(r[0]) for r in runs[i:i + 4])})")
        if segments and segments[-1].stack is None:
            segments[-1] = _Segment(None, True, (segments[-1].runs[0] + tuple(run),))
        else:
            segments.append(_Segment(None, True, (tuple(run),)))
        i += 1
    homes: dict[int, tuple[int, int | None, int]] = {}
    signatures: dict[tuple[int, int | None, int], tuple] = {}
    counts: dict[tuple[int, int | None], int] = {}
    for s, seg in enumerate(segments):
        for j, run in enumerate(seg.runs):
            layer = None if seg.stack is None else j
            ordinal = 0
            for it in run:
                if it[0] == "A":
                    homes[it[1]] = (s, layer, ordinal)
                    where = names.split(it[4])
                    module = it[4] if where is None or layer is None else (where[0], where[1] - layer, where[2])
                    signatures[(s, layer, ordinal)] = (it[2], it[3], module, it[5])
                    ordinal += 1
            counts[(s, layer)] = ordinal
    strides = _strides(segments, homes, k)
    families = set()
    for (s, j), row in strides.items():
        refs = [homes[it[1]] for it in segments[s].runs[j] if it[0] in ("F", "R") and homes[it[1]][1] is None]
        for (seg, _none, o), d in zip(refs, row):
            if d:
                families.add((segments[s].stack, seg, o - j * d, d))
    return _Template(tuple(segments), homes, signatures, counts, {}, strides, tuple(sorted(families)))


def _taken_by_a_cut_layer(t: _Template, seg: int, ordinal: int, n_of: dict[str, int], k: int) -> bool:
    """Whether a tensor outside the stacks is the one of a per-layer run (``_Template.families``) that a
    layer cut from the template but written out (k <= layer < n) takes: code outside the stacks that
    touches it in the cut model touches that layer's own tensor in the uncut one."""
    for stack, fseg, base, d in t.families:
        if fseg == seg and (ordinal - base) % d == 0 and k <= (ordinal - base) // d < n_of[stack]:
            return True
    return False


def _strides(segments: tuple[_Segment, ...], homes: dict[int, tuple[int, int | None, int]],
             k: int) -> dict[tuple[int, int], tuple[int, ...]]:
    """``_Template.strides``: each layer's references outside the stacks against a neighbour's (the one
    before, else the one after, with as many such references)."""
    refs: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for s, seg in enumerate(segments):
        if seg.stack is None:
            continue
        for j, run in enumerate(seg.runs):
            refs[(s, j)] = [homes[it[1]][::2] for it in run if it[0] in ("F", "R") and homes[it[1]][1] is None]
    out: dict[tuple[int, int], tuple[int, ...]] = {}
    for (s, j), mine in refs.items():
        near = next((jj for jj in (j - 1, j + 1) if 0 <= jj < k and len(refs[(s, jj)]) == len(mine)), None)
        strides = []
        for m, (seg, o) in enumerate(mine):
            d = 0
            if near is not None and refs[(s, near)][m][0] == seg:
                diff = o - refs[(s, near)][m][1]
                d = diff // (j - near) if diff % (j - near) == 0 else 0
            strides.append(d)
        out[(s, j)] = tuple(strides)
    return out


_EDGE = 2
"""Layers at each end of a stack written from their own template layer."""


def _source_layer(layer: int, n: int, k: int = TEMPLATE_LAYERS) -> int:
    """The template layer whose stretch layer ``layer`` of ``n`` repeats: the first two and the last two
    from their own, every other one from the middle one (``_EDGE``)."""
    if layer < _EDGE:
        return layer
    return k - (n - layer) if layer >= n - _EDGE else _EDGE


def _target(where_layer: int, stack: str, ctx: tuple[str, int, int] | None, n_of: dict[str, int],
            k: int = TEMPLATE_LAYERS) -> int:
    """The layer of ``n_of[stack]`` that a reference to template layer ``where_layer`` of ``stack`` reaches
    from ``ctx`` (stack, template layer, layer written) or from outside the stacks."""
    n = n_of[stack]
    if ctx is not None and ctx[0] == stack:
        target = ctx[2] + where_layer - ctx[1]
    elif where_layer < _EDGE:
        target = where_layer
    elif where_layer >= k - _EDGE:
        target = n - (k - where_layer)
    else:
        raise NotReusable(f"code outside {stack} refers to its layer {where_layer}")
    if not 0 <= target < n:
        raise NotReusable(f"a reference reaches layer {target} of {stack}'s {n}")
    return target


def _aligned(t: _Template, seg: int, a: int, b: int) -> dict[int, int]:
    """Ordinals of template layer ``a``'s allocations -> the same allocations of layer ``b`` (in one segment):
    the longest matching blocks of their (bytes, category, module, op) sequences (difflib)."""
    key = (seg, a, b)
    if key not in t.alignments:
        import difflib

        seq = {j: [t.signatures[(seg, j, o)] for o in range(t.counts.get((seg, j), 0))] for j in (a, b)}
        matcher = difflib.SequenceMatcher(None, seq[a], seq[b], autojunk=False)
        t.alignments[key] = {block.a + d: block.b + d for block in matcher.get_matching_blocks() for d in range(block.size)}
    return t.alignments[key]


def _expand(t: _Template, names: _Names, n_of: dict[str, int]) -> list[tuple]:
    """The template written out with ``n_of[stack]`` layers per stack, in ``_items``' form."""
    out: list[tuple] = []
    new: dict[tuple[int, int | None, int], int] = {}

    def rename(name: str | None, ctx: tuple[str, int, int] | None) -> str | None:
        where = names.split(name)
        if where is None:
            return name
        layer = _target(where[1], where[0], ctx, n_of)
        return f"{where[0]}.{layer}" + (f".{where[2]}" if where[2] else "")

    def resolve(inst: int, ctx: tuple[str, int, int] | None, stride: int = 0) -> int:
        seg, layer, ordinal = t.homes[inst]
        if layer is None:
            key = (seg, None, ordinal + (ctx[2] - ctx[1]) * stride if ctx is not None else ordinal)
            if key not in new:
                raise NotReusable(f"a reference reaches allocation {key[2]} outside the stacks")
            return new[key]
        stack = t.segments[seg].stack
        target = _target(layer, stack, ctx, n_of)
        source = _source_layer(target, n_of[stack])
        if source != layer:
            ordinal = _aligned(t, seg, layer, source).get(ordinal, -1)
            if ordinal < 0:
                raise NotReusable(f"layer {source} of {stack} has no like of a tensor of layer {layer}")
        try:
            return new[(seg, target, ordinal)]
        except KeyError:
            raise NotReusable(f"a reference to layer {target} of {stack} before it runs") from None

    for s, seg in enumerate(t.segments):
        if seg.stack is None:
            plan = [(None, seg.runs[0], None)]
        else:
            n = n_of[seg.stack]
            layers = range(n) if seg.ascending else range(n - 1, -1, -1)
            plan = [(layer, seg.runs[_source_layer(layer, n)], (seg.stack, _source_layer(layer, n), layer))
                    for layer in layers]
        for layer, run, ctx in plan:
            ordinal = 0
            strides = iter(t.strides.get((s, ctx[1]), ()) if ctx is not None else ())
            for it in run:
                kind = it[0]
                if kind == "A":
                    inst = new[(s, layer, ordinal)] = len(new)
                    ordinal += 1
                    out.append(("A", inst, it[2], it[3], rename(it[4], ctx), it[5]))
                elif kind in ("F", "R"):
                    home = t.homes[it[1]]
                    if ctx is None and home[1] is None and t.families and _taken_by_a_cut_layer(
                            t, home[0], home[2], n_of, TEMPLATE_LAYERS):
                        continue
                    stride = next(strides) if t.homes[it[1]][1] is None and ctx is not None else 0
                    out.append((kind, resolve(it[1], ctx, stride), *it[2:]))
                elif kind == "E":
                    out.append(("E", it[1], rename(it[2], ctx), rename(it[3], ctx)))
                else:
                    out.append(it)
    return out


# ------------------------------------------------------------------------------------ N layers
def _record(items: list[tuple], template: StepRecord, tables: Any, names: _Names,
            n_of: dict[str, int]) -> StepRecord:
    """A ``StepRecord`` for the uncut model from its items: the tracker's log, events (their activation
    bytes recomputed as ``AllocationTracker`` counts them) and marks."""
    module_names, param_names, numels, module_params = tables
    module_index = {n: i for i, n in enumerate(module_names)}
    param_index = {n: i for i, n in enumerate(param_names)}
    log: list[tuple] = []
    events: list[tuple[str, int, int, int, int]] = []
    marks: list[tuple[int, int]] = []
    live: dict[int, list] = {}
    act = seg_max = 0
    end_forward_at = 0
    for it in items:
        kind = it[0]
        if kind == "A":
            live[it[1]] = [it[2], it[3]]
            log.append((tk.ALLOC, it[1], it[2], it[3], module_index[it[4]] if it[4] is not None else tk.NO_MODULE, it[5]))
            if it[3] in _ACT:
                act += it[2]
                seg_max = max(seg_max, act)
        elif kind == "F":
            nbytes, cat = live.pop(it[1])
            log.append((tk.FREE, it[1]))
            if cat in _ACT:
                act -= nbytes
        elif kind == "R":
            entry = live[it[1]]
            old, entry[1] = entry[1], it[2]
            log.append((tk.RECAT, it[1], it[2]))
            if old in _ACT and it[2] not in _ACT:
                act -= entry[0]
            elif it[2] in _ACT and old not in _ACT:
                act += entry[0]
                seg_max = max(seg_max, act)
        elif kind == "E":
            marks.append((len(log), len(events)))
            events.append((it[1], module_index[it[2]] if it[2] is not None else tk.NO_MODULE,
                           param_index[it[3]] if it[3] is not None else -1, act, seg_max))
            seg_max = act
            if it[1] == "end_forward":
                end_forward_at = len(log)
        else:
            marks.append((len(log), -1 - it[1]))
    by_name = {p.name: p for p in template.params}
    params = []
    for name, numel in zip(param_names, numels):
        where = names.split(name)
        source = name if where is None else (
            f"{where[0]}.{_source_layer(where[1], n_of[where[0]])}" + (f".{where[2]}" if where[2] else ""))
        p = by_name.get(source)
        if p is None or p.numel != numel:
            raise NotReusable(f"param {name} has no like in the cut model")
        params.append(replace(p, name=name))
    return replace(template, names=tuple(module_names), params=tuple(params), module_params=tuple(module_params),
                   log=log, events=tuple(events), marks=tuple(marks), end_forward_at=end_forward_at)


def reused_record(model: Any, stacks: tuple[LayerStack, ...], trace_cut: Callable[[], StepRecord],
                  tables: Any) -> StepRecord:
    """The uncut model's step record, from traces of the model cut to 6 and to 5 layers per stack
    (``trace_cut`` traces the model as it stands); ``NotReusable`` when the 5-layer template written
    out for 6 layers is not the 6-layer trace record for record. ``tables``: the uncut model's module
    names, param names, param sizes and each module's direct params."""
    names = _Names(stacks)
    with cut_stacks(model, stacks, CHECK_LAYERS):
        check = trace_cut()
    with cut_stacks(model, stacks, TEMPLATE_LAYERS):
        template_record = trace_cut()
    template = _template(_items(template_record), names)
    written = _sorted_frees(_expand(template, names, {s.prefix: CHECK_LAYERS for s in stacks}))
    if written != _items(check):
        raise NotReusable(f"the {CHECK_LAYERS}-layer trace is not the {TEMPLATE_LAYERS}-layer one written out for "
                          f"{CHECK_LAYERS} layers")
    items = _sorted_frees(_expand(template, names, {s.prefix: s.layers for s in stacks}))
    record = _record(items, template_record, tables, names, {s.prefix: s.layers for s in stacks})
    t1, t2 = check.timings, template_record.timings
    return replace(record, timings=replace(t1, forward_s=t1.forward_s + t2.forward_s,
                                           backward_s=t1.backward_s + t2.backward_s))
