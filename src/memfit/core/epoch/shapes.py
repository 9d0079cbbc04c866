"""The batch shapes of an epoch, step by step, as the sampler and collator form them.

Rank 0's micro-batches are drawn from the length distribution (``core/batch_shapes.py``) with a
seeded generator (the epoch is one draw of the sampler's order):

- ``pad-longest`` (a random sampler and ``padding="longest"``): each sample drawn with probability
  proportional to its count (with replacement: for datasets of many samples the same as the
  epoch's permutation), the batch padded to its longest;
- ``bucket`` (``group_by_length``: transformers' ``LengthGroupedSampler``): mega-batches of
  ``50 x micro_batch x world`` random samples, each sorted longest first and cut into batches, the
  mega-batch holding the longest sample first (its ``megabatch_mult`` is 50);
- ``pack``: every batch is ``micro_batch x max_seq_length``.

``max_seq_length`` truncates first. With gradient accumulation an optimizer step has several
micro-batches; the step is simulated at its longest (``core/epoch/simulate.py`` says so).

Without a distribution (``--epoch`` alone) memfit's default is used and stated: a log-normal of
sample lengths with median a quarter of the planned length and sigma 0.8 (the right-skewed shape of
instruction-tuning sets; an assumption, not a measurement), truncated at the planned length.

Shapes are rounded up to a multiple of ``quantum`` (``shape_quantum``: the smallest power of two >= 8
that leaves at most ``MAX_SHAPES`` distinct lengths), so that the simulation sees few distinct shapes;
rounding up only ever pads a batch more.
"""

from __future__ import annotations

import math
import random
from itertools import accumulate

from memfit.core.lean_dataclass import dataclass
from memfit.core.batch_shapes import LengthDistribution

MAX_SHAPES = 32
DEFAULT_SAMPLES = 2000
MEGABATCH_MULT = 50


@dataclass(frozen=True, slots=True, kw_only=True)
class EpochShapes:
    lengths: tuple[int, ...]
    """Padded (and rounded) tokens per row of each optimizer step's batch, in step order."""
    micro_batch: int
    quantum: int
    rule: str
    source: str
    """Where the lengths came from, in words (a file, or the default assumption)."""


def default_distribution(seq_len: int) -> LengthDistribution:
    """memfit's stated default (module docstring): ``DEFAULT_SAMPLES`` quantiles of a log-normal."""
    median, sigma = max(seq_len / 4, 1.0), 0.8
    hist: dict[int, int] = {}
    for k in range(DEFAULT_SAMPLES):
        z = _probit((k + 0.5) / DEFAULT_SAMPLES)
        n = min(max(int(round(median * math.exp(sigma * z))), 1), seq_len)
        hist[n] = hist.get(n, 0) + 1
    lengths = tuple(sorted(hist))
    return LengthDistribution(lengths=lengths, counts=tuple(hist[n] for n in lengths),
                              source=f"memfit's default: log-normal, median {median:,.0f} tokens, sigma {sigma}, "
                                     f"truncated at {seq_len:,}")


def _probit(p: float) -> float:
    """The standard normal quantile (Acklam's rational approximation, |error| < 1.2e-9)."""
    a = (-3.969683028665376e1, 2.209460984245205e2, -2.759285104469687e2, 1.383577518672690e2,
         -3.066479806614716e1, 2.506628277459239)
    b = (-5.447609879822406e1, 1.615858368580409e2, -1.556989798598866e2, 6.680131188771972e1, -1.328068155288572e1)
    c = (-7.784894002430293e-3, -3.223964580411365e-1, -2.400758277161838, -2.549732539343734, 4.374664141464968,
         2.938163982698783)
    d = (7.784695709041462e-3, 3.224671290700398e-1, 2.445134137142996, 3.754408661907416)
    if p < 0.02425:
        q = math.sqrt(-2 * math.log(p))
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / \
            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    if p > 1 - 0.02425:
        return -_probit(1 - p)
    q = p - 0.5
    r = q * q
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / \
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)


def shape_quantum(longest: int) -> int:
    q = 8
    while math.ceil(longest / q) > MAX_SHAPES:
        q *= 2
    return q


def epoch_shapes(dist: LengthDistribution, *, rule: str, micro_batch: int, world: int, grad_accum: int, steps: int,
                 max_seq_length: int | None, seed: int, source: str) -> EpochShapes:
    """``steps`` optimizer steps of rank 0 (see the module docstring)."""
    cap = max_seq_length or dist.longest
    if rule == "pack":
        q = shape_quantum(cap)
        return EpochShapes(lengths=(cap,) * steps, micro_batch=micro_batch, quantum=1, rule=rule, source=source)
    rng = random.Random(seed)
    lengths = [min(n, cap) for n in dist.lengths]
    cum = list(accumulate(dist.counts))  # choices(cum_weights=cum) is choices(weights=counts) draw for draw,
    # without accumulating the counts again on every call
    longest = max(lengths)
    q = shape_quantum(longest)
    need = steps * grad_accum
    rows: list[int] = []
    if rule == "bucket":
        mega = MEGABATCH_MULT * micro_batch * world
        first = True
        while len(rows) < need:
            draw = rng.choices(lengths, cum_weights=cum, k=mega)
            if first:  # LengthGroupedSampler puts the mega-batch with the longest sample first
                draw[0] = longest
                first = False
            draw.sort(reverse=True)
            # the mega-batch's batches, rank 0 taking every world-th one (DistributedLengthGroupedSampler)
            batches = [draw[i:i + micro_batch] for i in range(0, len(draw), micro_batch)]
            rows.extend(b[0] for b in batches[::world])
    else:
        for _ in range(need):
            rows.append(max(rng.choices(lengths, cum_weights=cum, k=micro_batch)))
    rows = rows[:need]
    per_step = [max(rows[i * grad_accum:(i + 1) * grad_accum]) for i in range(steps)]
    rounded = tuple(min(-(-n // q) * q, max(cap, longest)) for n in per_step)
    return EpochShapes(lengths=rounded, micro_batch=micro_batch, quantum=q, rule=rule, source=source)
