"""Real batch shapes: which batch a dataset's lengths and the batching rule make the largest.

Activation memory grows with the padded batch shape ``micro_batch x seq_len``, so a run's peak comes
from the longest batch its sampler can form, not from the average sample. Given the token count of
every sample (or a histogram) and the batching rule, ``longest_batch`` returns that batch's shape
and how often it occurs:

- ``pad-longest`` (``DataCollatorWithPadding``/``padding="longest"`` with a random sampler): each
  batch is padded to its longest sample, so the peak batch is ``micro_batch x L_max`` and it occurs
  whenever a batch draws one of the samples of length ``L_max``: with ``c`` of ``n`` samples that
  long, a batch of ``b`` drawn without replacement holds one with probability
  ``1 - C(n - c, b) / C(n, b)``;
- ``bucket`` (``group_by_length``: transformers' ``LengthGroupedSampler`` sorts mega-batches by
  length and puts the batch holding the longest sample first): ``micro_batch x L_max``, once per
  epoch, at the first step;
- ``pack`` (samples concatenated into rows of ``max_seq_length``, e.g. TRL's ``packing=True``):
  every batch is ``micro_batch x max_seq_length``.

``max_seq_length`` (the tokenizer's truncation) caps every sample first. Lengths files: one token
count per line (a ``#`` starts a comment), or ``length,count`` / ``length count`` lines (a
histogram), or JSON: a list of counts, ``{"lengths": [...]}`` or ``{"<length>": count, ...}``.
"""

from __future__ import annotations

import math
from pathlib import Path

from memfit.core.lean_dataclass import dataclass
from memfit.errors import MemfitError

BATCHING_RULES = ("pad-longest", "bucket", "pack")


@dataclass(frozen=True, slots=True)
class LengthDistribution:
    """Token counts of a dataset's samples, as a histogram."""

    lengths: tuple[int, ...]
    """Distinct lengths, ascending."""
    counts: tuple[int, ...]
    """Samples of each length."""
    source: str

    @property
    def samples(self) -> int:
        return sum(self.counts)

    @property
    def longest(self) -> int:
        return self.lengths[-1]

    @property
    def mean(self) -> float:
        return sum(length * n for length, n in zip(self.lengths, self.counts)) / self.samples


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchShape:
    """The largest batch the rule forms from the distribution."""

    rule: str
    micro_batch: int
    seq_len: int
    """Padded (or packed) tokens per row of the largest batch."""
    probability: float
    """Chance that a given batch has this shape."""
    batches_per_epoch: int
    """Micro-batches per epoch on one rank."""
    samples: int
    truncated: int
    """Samples longer than ``max_seq_length`` (cut to it)."""
    mean_length: float

    @property
    def per_epoch(self) -> float:
        """Expected number of batches of this shape per epoch on one rank."""
        return self.probability * self.batches_per_epoch

    def describe(self) -> str:
        shape = f"{self.micro_batch} x {self.seq_len:,} tokens"
        cut = f"; {self.truncated:,} samples cut to {self.seq_len:,}" if self.truncated else ""
        if self.rule == "pack":
            return (f"Batch shape: packed rows of {self.seq_len:,} tokens, every batch is {shape} "
                    f"({self.samples:,} samples, mean {self.mean_length:,.0f} tokens{cut})")
        if self.rule == "bucket":
            how = "once per epoch (group_by_length puts the batch with the longest sample first)"
        else:
            how = (f"in {self.probability:.2%} of batches, about {self.per_epoch:,.1f} of the "
                   f"{self.batches_per_epoch:,} per epoch (any batch that draws a sample of that length)")
        return (f"Largest batch ({self.rule}): {shape}, padded to the longest sample; it occurs {how}; "
                f"{self.samples:,} samples, mean {self.mean_length:,.0f} tokens{cut}")


MAX_LENGTHS_BYTES = 64 * 2**20
"""A lengths file: one count per line for ~10 million samples, or a histogram (a few KiB)."""
MAX_LENGTH = 2**31 - 1
"""The longest sample a lengths file may give (as every count memfit reads)."""
MAX_SAMPLES = 10**15
"""Samples of one length in a histogram (far beyond any dataset; keeps the products exact)."""
MAX_JSON_VALUES = 20_000_000
"""Values in a JSON lengths file (a list of counts per sample)."""


def read_lengths(path: str | Path) -> LengthDistribution:
    """Parse a lengths file (see the module docstring) through the bounded reader (size cap, UTF-8,
    JSON depth); every count a whole number within range; one-line ``MemfitError`` if malformed."""
    from memfit.core.reading import decode_text, parse_json, read_bytes

    p = Path(path)
    text = decode_text(read_bytes(p, what="lengths file", max_bytes=MAX_LENGTHS_BYTES), what=f"lengths file {p}")
    stripped = text.lstrip()
    hist: dict[int, int] = {}
    if stripped.startswith(("[", "{")):
        data = parse_json(text, what=f"lengths file {p}", max_nodes=MAX_JSON_VALUES)
        if isinstance(data, dict) and "lengths" in data:
            data = data["lengths"]
        if isinstance(data, list):
            for value in data:
                _add(hist, _count(value, p), 1, p)
        elif isinstance(data, dict):
            for key, value in data.items():
                _add(hist, _count(key, p), _count(value, p, zero=True), p)
        else:
            raise MemfitError(f"{p}: expected a list of token counts or a {{length: count}} histogram")
    else:
        import io
        from collections import Counter

        # a dataset's lines repeat (a few thousand distinct lengths): each distinct line is parsed once,
        # and the lines are read one at a time (no list of ten million strings)
        for raw_line, times in Counter(io.StringIO(text)).items():
            line = raw_line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.replace(",", " ").split()
            if len(parts) == 1:
                _add(hist, _count(parts[0], p, line=_first_line(text, raw_line)), times, p)
            elif len(parts) == 2:
                at = _first_line(text, raw_line)
                _add(hist, _count(parts[0], p, line=at), _count(parts[1], p, line=at, zero=True) * times, p)
            else:
                raise MemfitError(f"{p} line {_first_line(text, raw_line)}: expected a token count or 'length,count', "
                                  f"got {line[:60]!r}")
    hist = {length: n for length, n in hist.items() if n}
    if not hist:
        raise MemfitError(f"{p}: no sample lengths")
    lengths = tuple(sorted(hist))
    return LengthDistribution(lengths=lengths, counts=tuple(hist[length] for length in lengths), source=str(p))


class _first_line:  # noqa: N801 (a lazy value: computed only for a message)
    """The number of the first line that is ``raw_line``, worked out only when an error names it."""

    def __init__(self, text: str, raw_line: str) -> None:
        self.text, self.raw_line = text, raw_line

    def __str__(self) -> str:
        at = self.text.find(self.raw_line)
        while at > 0 and self.text[at - 1] != "\n":
            at = self.text.find(self.raw_line, at + 1)
        return str(self.text.count("\n", 0, max(at, 0)) + 1)

    def __bool__(self) -> bool:
        return True


def _count(value: object, p: Path, *, line: object = None, zero: bool = False) -> int:
    """A token length (1 to ``MAX_LENGTH``) or, with ``zero``, a sample count (0 to ``MAX_SAMPLES``)."""
    where = f"{p} line {line}" if line else str(p)
    limit = MAX_SAMPLES if zero else MAX_LENGTH
    number = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and value.is_integer() and abs(value) <= limit:
        number = int(value)
    elif isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 19:
        number = int(value.strip())
    shown = repr(value) if len(repr(value)) <= 40 else f"a value of {len(repr(value))} characters"
    if number is None:
        raise MemfitError(f"{where}: {shown} is not a {'count' if zero else 'token count'} (a whole number)")
    if not (0 if zero else 1) <= number <= limit:
        raise MemfitError(f"{where}: {shown} is not a {'count' if zero else 'token count'} from {0 if zero else 1} "
                          f"to {limit:,}")
    return number


def _add(hist: dict[int, int], length: int, count: int, p: Path) -> None:
    total = hist.get(length, 0) + count
    if total > MAX_SAMPLES:
        raise MemfitError(f"{p}: over {MAX_SAMPLES:,} samples of length {length}; memfit refuses")
    hist[length] = total


def longest_batch(
    dist: LengthDistribution,
    *,
    rule: str,
    micro_batch: int,
    max_seq_length: int | None = None,
    world_size: int = 1,
) -> BatchShape:
    """The largest batch ``rule`` forms (see the module docstring)."""
    if rule not in BATCHING_RULES:
        raise MemfitError(f"batching must be one of {', '.join(BATCHING_RULES)}, got {rule!r}")
    if micro_batch < 1 or world_size < 1:
        raise MemfitError(f"micro_batch and world size must be >= 1, got {micro_batch} and {world_size}")
    n = dist.samples
    truncated = sum(c for length, c in zip(dist.lengths, dist.counts) if max_seq_length and length > max_seq_length)
    if rule == "pack":
        if not max_seq_length:
            raise MemfitError("batching 'pack' needs max_seq_length (the length of a packed row)")
        tokens = sum(length * c for length, c in zip(dist.lengths, dist.counts))
        rows = math.ceil(tokens / max_seq_length)
        return BatchShape(rule=rule, micro_batch=micro_batch, seq_len=max_seq_length, probability=1.0,
                          batches_per_epoch=max(math.ceil(rows / (micro_batch * world_size)), 1), samples=n,
                          truncated=0, mean_length=dist.mean)
    longest = min(dist.longest, max_seq_length) if max_seq_length else dist.longest
    at_longest = sum(c for length, c in zip(dist.lengths, dist.counts) if length >= longest)
    batches = max(math.ceil(n / (micro_batch * world_size)), 1)
    if rule == "bucket":
        probability = 1.0 / batches
    else:
        probability = 1.0 - _none_drawn(n, at_longest, min(micro_batch, n))
    return BatchShape(rule=rule, micro_batch=micro_batch, seq_len=longest, probability=probability,
                      batches_per_epoch=batches, samples=n, truncated=truncated, mean_length=dist.mean)


def _none_drawn(n: int, c: int, b: int) -> float:
    """``C(n - c, b) / C(n, b)``: a batch of ``b`` drawn without replacement holds none of ``c``."""
    if b > n - c:
        return 0.0
    product = 1.0
    for k in range(b):
        product *= (n - c - k) / (n - k)
    return product
