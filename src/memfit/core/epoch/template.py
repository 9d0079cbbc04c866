"""One steady-state step as the CUDA caching allocator sees it, for any batch length.

The ledger writes the step as ``alloc``/``free`` events (``Timeline.events``). A step's events differ
between batch lengths only in their sizes: activations are sums of products of at most two lengths
(the attention scores of eager attention: ``s x s_kv``), so each event's size is a polynomial of
degree <= 2 in the length at a fixed micro-batch. ``StepTemplate.build`` takes the steady-state step
(``step2.forward`` through ``step2.optimizer_step``) of three timelines written by the recipes at
three lengths, checks that their events line up one to one (same tensor, same order), and fits each
size exactly (Lagrange, integer arithmetic); ``ops(length)`` then gives the step at any length without
running the recipes. Where a size is not such a polynomial (it does not divide out exactly at a
length asked for) the size is rounded up and counted in ``inexact``.

Frees are resolved to tensors as the timeline resolves them (``Timeline.free``: the whole item, or
its most recent live tensor of exactly that size, or a lump split), so each op names one tensor.
Tensors alive when the step starts and freed inside it (``carry_in``: ZeRO-3's persistent params
released by ``step()``) and tensors made inside it that outlive it (``carry_out``: gathered again by
``_post_step``) are matched by item and order from one step to the next.
"""

from __future__ import annotations

from math import gcd, lcm

from memfit.core.lean_dataclass import dataclass
from memfit.core.ledger_types import Device

STEP_START, STEP_END = "step2.forward", ("eval.forward", "eval.generate", "save")


class TemplateError(Exception):
    """The timelines' steps do not line up: no template (the epoch simulation says why)."""


@dataclass(frozen=True, slots=True)
class Resolved:
    """One step's GPU events with tensor ids: ``(is_alloc, tensor id, bytes)``."""

    ops: tuple[tuple[bool, int, int], ...]
    keys: tuple[str, ...]
    """The item of each op (to check that two timelines line up)."""
    carry_in: tuple[tuple[str, int], ...]
    """(item, tensor id) of tensors alive at the start and freed in the step, in order of their free."""
    carry_out: tuple[tuple[str, int], ...]
    """(item, tensor id) of tensors made in the step and alive at its end."""
    backward_at: int
    """Index of the first op of ``step2.backward`` (where the Trainer's empty_cache runs)."""
    optimizer_at: int
    """Index of the first op of ``step2.optimizer_step``."""
    before: tuple[tuple[bool, int, int], ...]
    """Every GPU op before the step (to bring an allocator to the step's starting state)."""
    outside_bytes: int
    """GPU memory outside PyTorch at the step (CUDA context, NCCL, ...): never in the allocator."""


def resolve(t, start: str = STEP_START, ends: tuple[str, ...] = STEP_END) -> Resolved:  # noqa: ANN001
    """``t`` (a ``Timeline``): its GPU events resolved to tensors; the window from phase ``start`` to
    the first of ``ends`` (or the end)."""
    return resolve_windows(t, ((start, ends),))[0]


def resolve_windows(t, windows) -> tuple[Resolved, ...]:  # noqa: ANN001
    """Several windows (``(start, ends)`` pairs) of one timeline in one pass over its events."""
    starts = dict(t.phase_starts)
    bounds = []
    for start, ends in windows:
        if start not in starts:
            raise TemplateError(f"the ledger has no {start} phase")
        s = starts[start]
        e = min((starts[n] for n in ends if n in starts and starts[n] > s), default=len(t.events))
        bounds.append((s, e, starts.get(start.replace("forward", "backward"), e),
                       starts.get(start.replace("forward", "optimizer_step"), e)))
    meta = t._meta  # noqa: SLF001 - the timeline's own declarations
    live: dict[str, list[list[int]]] = {}
    totals: dict[str, int] = {}
    ops: list[tuple[bool, int, int]] = []
    keys: list[str] = []
    at: list[int] = []
    """The event index of each op."""
    outside_at: list[tuple[int, int]] = []
    nxt = 0
    outside = 0
    gpu = Device.GPU
    outside_keys = {k for k, m in meta.items() if m.outside_allocator}
    for idx, (op, key, dev, n) in enumerate(t.events):
        if dev is not gpu:
            continue
        if key in outside_keys:
            outside += n if op == "alloc" else -n
            outside_at.append((idx, outside))
            continue
        ts = live.get(key)
        if ts is None:
            ts = live[key] = []
        if op == "alloc":
            ts.append([n, nxt])
            totals[key] = totals.get(key, 0) + n
            ops.append((True, nxt, n))
            keys.append(key)
            at.append(idx)
            nxt += 1
            continue
        total = totals.get(key, 0)
        freed: list[list[int]] = []
        if n == total:
            freed = list(reversed(ts))
            ts.clear()
        else:
            for i in range(len(ts) - 1, -1, -1):
                if ts[i][0] == n:
                    freed = [ts.pop(i)]
                    break
            else:  # part of a lump: the most recent tensors go, the remainder is allocated again
                remaining = n
                while remaining > 0:
                    x = ts.pop()
                    freed.append(x)
                    remaining -= x[0]
                if remaining < 0:
                    freed_total = sum(x[0] for x in freed)
                    for size, tid in freed:
                        ops.append((False, tid, size))
                        keys.append(key)
                        at.append(idx)
                    totals[key] = total - freed_total
                    ts.append([-remaining, nxt])
                    totals[key] += -remaining
                    ops.append((True, nxt, -remaining))
                    keys.append(key)
                    at.append(idx)
                    nxt += 1
                    continue
        totals[key] = total - sum(x[0] for x in freed)
        for size, tid in freed:
            ops.append((False, tid, size))
            keys.append(key)
            at.append(idx)
    from bisect import bisect_left

    out = []
    for s, e, bwd, opt in bounds:
        lo, hi = bisect_left(at, s), bisect_left(at, e)
        win = ops[lo:hi]
        made: dict[int, str] = {}
        carry_in: list[tuple[str, int]] = []
        for (is_alloc, tid, _), key in zip(win, keys[lo:hi]):
            if is_alloc:
                made[tid] = key
            elif tid in made:
                del made[tid]
            else:
                carry_in.append((key, tid))
        out_before = 0
        for i, v in outside_at:
            if i >= s:
                break
            out_before = v
        out.append(Resolved(ops=tuple(win), keys=tuple(keys[lo:hi]), carry_in=tuple(carry_in),
                            carry_out=tuple((k, tid) for tid, k in made.items()),
                            backward_at=bisect_left(at, bwd) - lo, optimizer_at=bisect_left(at, opt) - lo,
                            before=tuple(ops[:lo]), outside_bytes=out_before))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class StepTemplate:
    """The steady-state step at any length (module docstring)."""

    lengths: tuple[int, int, int]
    """The lengths whose timelines were fitted."""
    kinds: tuple[bool, ...]
    tids: tuple[int, ...]
    coeffs: tuple[tuple[int, int, int, int], ...]
    """Per op ``(a, b, c, d)``: bytes = (a L^2 + b L + c) / d."""
    carry_in: tuple[tuple[str, int], ...]
    carry_out: tuple[tuple[str, int], ...]
    backward_at: int
    optimizer_at: int

    @classmethod
    def build(cls, steps: dict[int, Resolved]) -> "StepTemplate":
        if len(steps) != 3:
            raise TemplateError("a template needs the step at three lengths")
        ls = tuple(sorted(steps))
        r = [steps[x] for x in ls]
        base = r[0]
        heads = [o[:2] for o in base.ops]
        for other in r[1:]:
            if (other.keys != base.keys or [o[:2] for o in other.ops] != heads
                    or other.carry_in != base.carry_in or other.carry_out != base.carry_out
                    or other.backward_at != base.backward_at or other.optimizer_at != base.optimizer_at):
                raise TemplateError("the steps written at different lengths do not line up event for event")
        coeffs = []
        mult, den = _basis(ls)
        m0, m1, m2 = mult
        for j in range(len(base.ops)):
            s0, s1, s2 = r[0].ops[j][2], r[1].ops[j][2], r[2].ops[j][2]
            if s0 == s1 == s2:
                coeffs.append((0, 0, s0, 1))
                continue
            w0, w1, w2 = s0 * m0[0], s1 * m1[0], s2 * m2[0]
            a = w0 + w1 + w2
            b = w0 * m0[1] + w1 * m1[1] + w2 * m2[1]
            c = w0 * m0[2] + w1 * m1[2] + w2 * m2[2]
            g = gcd(a, b, c, den)
            coeffs.append((a // g, b // g, c // g, den // g))
        return cls(lengths=ls, kinds=tuple(o[0] for o in base.ops), tids=tuple(o[1] for o in base.ops),
                   coeffs=tuple(coeffs), carry_in=base.carry_in, carry_out=base.carry_out,
                   backward_at=base.backward_at, optimizer_at=base.optimizer_at)

    def sizes(self, length: int) -> tuple[tuple[int, ...], int]:
        """Every op's bytes at ``length``, and how many were not exact (rounded up)."""
        out, inexact = [], 0
        L2 = length * length
        for a, b, c, d in self.coeffs:
            if d == 1:  # an integer polynomial (every op of the shipped recipes): no division
                if a or b:
                    num = a * L2 + b * length + c
                    out.append(num if num > 0 else 0)
                else:
                    out.append(c)
                continue
            num = a * L2 + b * length + c
            q, rem = divmod(num, d)
            if rem:
                inexact += 1
                q += 1
            out.append(max(q, 0))
        return tuple(out), inexact


def _basis(ls: tuple[int, int, int]) -> tuple[tuple[tuple[int, int, int], ...], int]:
    """The Lagrange basis on ``ls`` over one common denominator, in integers: ``D`` (the lcm of the
    basis polynomials' denominators ``prod_{j != i} (x_i - x_j)``, positive) and per ``i`` its
    multiplier ``D / den_i`` with the polynomial's ``(1, -(p + q), p q)``, so that a fitted size's
    coefficients of (L^2, L, 1) are ``sum_i s_i (D / den_i) (1, -(p + q), p q) / D``. Divided by the
    gcd of the three numerators and ``D``, that is each coefficient as a reduced fraction over the
    lcm of their denominators (what ``Fraction`` arithmetic gives, without its cost per op)."""
    dens = []
    for i, xi in enumerate(ls):
        den = 1
        for k, x in enumerate(ls):
            if k != i:
                den *= xi - x
        dens.append(den)
    D = lcm(*(abs(d) for d in dens))
    out = []
    for i, den in enumerate(dens):
        p, q = (x for k, x in enumerate(ls) if k != i)
        out.append((D // den, -(p + q), p * q))
    return tuple(out), D
