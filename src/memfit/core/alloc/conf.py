"""A strict parser of ``PYTORCH_CUDA_ALLOC_CONF`` for a given torch version.

The syntax is torch's ``ConfigTokenizer`` (2.13 ``c10/core/AllocatorConfig.h:35-130``): the text is
split at ``, : [ ]`` and whitespace is dropped; options are ``key:value`` or ``key:[a:b,c:d]``.
Value checks mirror 2.13's parsers (their messages are in ``torch/lib/libc10.so``; the limits read
from the disassembly of ``AcceleratorAllocatorConfig::parse*``):
- ``max_split_size_mb`` and ``max_non_split_rounding_mb`` must be >= ``large_segment_size`` in MiB
  (20 by default), clamped to SIZE_MAX >> 20, then times 2^20;
- ``large_segment_size_mb`` must be > 10 (kMinLargeAlloc in MiB);
- ``garbage_collection_threshold`` and ``per_process_memory_fraction`` in (0, 1) and (0, 1];
- ``roundup_power2_divisions``: a power of two, or ``[size_mb:div, ..., >:div]`` with power-of-two
  sizes and power-of-two (or 0) divisions (``CUDAAllocatorConfig::parseRoundUpPower2Divisions``);
- booleans are exactly ``True``/``False`` (``ConfigTokenizer::toBool``).
Anything torch rejects, or a key that torch version does not know, is a one-line MemfitError.
"""

from __future__ import annotations


from memfit.core.lean_dataclass import dataclass
from memfit.core.alloc.versions import CONF_KEYS, TorchVersion, keys_for
from memfit.errors import MemfitError

MiB = 2**20
SIZE_MAX = 2**64 - 1
LARGE_BUFFER = 20 * MiB
"""kLargeBuffer (CUDACachingAllocator.cpp @001074d2:47); 2.13's default large_segment_size_ and
max_non_split_rounding_size_ (AllocatorConfig.h:340-345)."""
ROUNDUP_INTERVALS = 16
"""kRoundUpPowerOfTwoIntervals: 1 MiB .. 64 GiB, one division count per power-of-two interval."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocConf:
    """The allocator settings that change bytes, with torch's defaults."""

    text: str = ""
    max_split_size: int = SIZE_MAX
    max_non_split_rounding: int = LARGE_BUFFER
    large_segment_size: int = LARGE_BUFFER
    roundup_power2_divisions: tuple[int, ...] = (0,) * ROUNDUP_INTERVALS
    garbage_collection_threshold: float = 0.0
    expandable_segments: bool = False
    per_process_memory_fraction: float | None = None
    pinned_max_round_threshold: int = SIZE_MAX
    pinned_max_cached_size: int = SIZE_MAX
    pinned_reserve_segment_size: int = 0
    notes: tuple[str, ...] = ()
    """What memfit accepted without modelling (speed-only options), said out loud."""

    def divisions_for(self, size: int) -> int:
        """``AcceleratorAllocatorConfig::roundup_power2_divisions(size)``: the interval index is
        floor(log2(size)) - 20, clamped to [0, 15]."""
        index = min(max(size.bit_length() - 1 - 20, 0), ROUNDUP_INTERVALS - 1)
        return self.roundup_power2_divisions[index]


def _tokens(text: str) -> list[str]:
    out, buf = [], ""
    for ch in text:
        if ch in ",:[]":
            if buf:
                out.append(buf)
                buf = ""
            out.append(ch)
        elif not ch.isspace():
            buf += ch
    if buf:
        out.append(buf)
    return out


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _int(key: str, tok: str) -> int:
    if not tok.isdigit():
        raise MemfitError(f"PYTORCH_CUDA_ALLOC_CONF: {key} needs a whole number, got {tok!r}")
    return int(tok)


def _float(key: str, tok: str) -> float:
    try:
        return float(tok)
    except ValueError:
        raise MemfitError(f"PYTORCH_CUDA_ALLOC_CONF: {key} needs a number, got {tok!r}") from None


def _bool(key: str, tok: str) -> bool:
    if tok not in ("True", "False"):
        raise MemfitError(f"PYTORCH_CUDA_ALLOC_CONF: {key} must be True or False (torch's spelling), got {tok!r}")
    return tok == "True"


def _divisions(key: str, toks: list[str]) -> tuple[int, ...]:
    """One number (every interval) or ``[size_mb:div, ..., >:div]`` (CUDAAllocatorConfig.cpp:
    ``parseRoundUpPower2Divisions``: the first entry also fills the intervals below it, ``>`` fills
    every interval after the last one given)."""
    out = [0] * ROUNDUP_INTERVALS
    if len(toks) == 1:
        v = _int(key, toks[0])
        if not _power_of_two(v):
            raise MemfitError(f"PYTORCH_CUDA_ALLOC_CONF: {key}: the divisions have to be a power of 2, got {v}")
        return (v,) * ROUNDUP_INTERVALS
    items = toks[1:-1]
    if not items:
        raise MemfitError(f"PYTORCH_CUDA_ALLOC_CONF: {key}: empty list")
    first, last = True, 0
    i = 0
    while i < len(items):
        if i + 2 >= len(items) or items[i + 1] != ":":
            raise MemfitError(f"PYTORCH_CUDA_ALLOC_CONF: {key}: expected size:divisions pairs, got {''.join(items)!r}")
        size_tok, div = items[i], _int(key, items[i + 2])
        if div != 0 and not _power_of_two(div):
            raise MemfitError(f"PYTORCH_CUDA_ALLOC_CONF: {key}: divisions have to be a power of 2 or 0, got {div}")
        if size_tok == ">":
            for j in range(last, ROUNDUP_INTERVALS):
                out[j] = div
        else:
            mb = _int(key, size_tok)
            if not _power_of_two(mb):
                raise MemfitError(f"PYTORCH_CUDA_ALLOC_CONF: {key}: the sizes have to be powers of 2 (MiB), got {mb}")
            index = min(mb.bit_length() - 1, ROUNDUP_INTERVALS - 1)
            if first:
                for j in range(index):
                    out[j] = div
                first = False
            out[index] = div
            last = index
        i += 3
        if i < len(items):
            if items[i] != ",":
                raise MemfitError(f"PYTORCH_CUDA_ALLOC_CONF: {key}: expected ',' between pairs, got {items[i]!r}")
            i += 1
    return tuple(out)


def parse_alloc_conf(text: str | None, version: TorchVersion) -> AllocConf:
    """``'expandable_segments:True,max_split_size_mb:128'`` for ``version`` -> ``AllocConf``."""
    if text is None or not text.strip():
        return AllocConf()
    toks = _tokens(text)
    known = keys_for(version)
    values: dict[str, object] = {}
    notes: list[str] = []
    i = 0
    while i < len(toks):
        key = toks[i]
        if key in ",:[]":
            raise MemfitError(f"PYTORCH_CUDA_ALLOC_CONF: expected an option name, got {key!r} in {text!r}")
        if key not in CONF_KEYS:
            raise MemfitError(f"PYTORCH_CUDA_ALLOC_CONF: unknown option {key!r} (torch {version.name} knows: "
                              f"{', '.join(known)})")
        if key not in known:
            c = CONF_KEYS[key]
            raise MemfitError(f"PYTORCH_CUDA_ALLOC_CONF: {key} is not known to torch {version.name} "
                              f"(added in {c.since}: {c.since_source})")
        if i + 2 >= len(toks) or toks[i + 1] != ":":
            raise MemfitError(f"PYTORCH_CUDA_ALLOC_CONF: {key} needs a value (key:value)")
        if toks[i + 2] == "[":
            try:
                end = toks.index("]", i + 2)
            except ValueError:
                raise MemfitError(f"PYTORCH_CUDA_ALLOC_CONF: {key}: '[' without ']'") from None
            value_toks = toks[i + 2:end + 1]
            i = end + 1
        else:
            value_toks = [toks[i + 2]]
            i += 3
        if len(value_toks) > 1 and key != "roundup_power2_divisions":
            raise MemfitError(f"PYTORCH_CUDA_ALLOC_CONF: {key} takes one value, not a list")
        values[key] = value_toks
        if i < len(toks):
            if toks[i] != ",":
                raise MemfitError(f"PYTORCH_CUDA_ALLOC_CONF: expected ',' after {key}'s value, got {toks[i]!r}")
            i += 1
    return _build(text, values, notes, version)


def _build(text: str, values: dict[str, object], notes: list[str], version: TorchVersion) -> AllocConf:
    kw: dict[str, object] = {}
    one = {k: v[0] for k, v in values.items() if len(v) == 1}  # type: ignore[index]
    large = LARGE_BUFFER
    if "large_segment_size_mb" in one:
        mb = _int("large_segment_size_mb", one["large_segment_size_mb"])
        if mb <= 10:
            raise MemfitError(f"PYTORCH_CUDA_ALLOC_CONF: large_segment_size_mb must be > 10, got {mb}")
        large = min(mb, SIZE_MAX >> 20) * MiB
        kw["large_segment_size"] = large
    for key, field in (("max_split_size_mb", "max_split_size"), ("max_non_split_rounding_mb", "max_non_split_rounding")):
        if key in one:
            mb = _int(key, one[key])
            if mb < large // MiB:
                raise MemfitError(f"PYTORCH_CUDA_ALLOC_CONF: {key} too small, must be >= {large // MiB}, got {mb}")
            kw[field] = min(mb, SIZE_MAX >> 20) * MiB
    for key, field in (("pinned_max_round_threshold_mb", "pinned_max_round_threshold"),
                       ("pinned_max_cached_size_mb", "pinned_max_cached_size"),
                       ("pinned_reserve_segment_size_mb", "pinned_reserve_segment_size")):
        if key in one:
            kw[field] = min(_int(key, one[key]), SIZE_MAX >> 20) * MiB
    if "garbage_collection_threshold" in one:
        v = _float("garbage_collection_threshold", one["garbage_collection_threshold"])
        if not 0.0 < v < 1.0:
            raise MemfitError(f"PYTORCH_CUDA_ALLOC_CONF: garbage_collection_threshold must be in (0.0, 1.0), got {v}")
        kw["garbage_collection_threshold"] = v
    if "per_process_memory_fraction" in one:
        v = _float("per_process_memory_fraction", one["per_process_memory_fraction"])
        if not 0.0 < v <= 1.0:
            raise MemfitError(f"PYTORCH_CUDA_ALLOC_CONF: per_process_memory_fraction must be in (0.0, 1.0], got {v}")
        kw["per_process_memory_fraction"] = v
    if "expandable_segments" in one:
        kw["expandable_segments"] = _bool("expandable_segments", one["expandable_segments"])
    if "roundup_power2_divisions" in values:
        kw["roundup_power2_divisions"] = _divisions("roundup_power2_divisions", values["roundup_power2_divisions"])  # type: ignore[arg-type]
    if "backend" in one:
        b = one["backend"]
        if b == "cudaMallocAsync":
            raise MemfitError("PYTORCH_CUDA_ALLOC_CONF: backend:cudaMallocAsync hands memory to CUDA's stream-ordered "
                              "allocator, which memfit does not simulate (use backend:native or leave it unset)")
        if b != "native":
            raise MemfitError(f"PYTORCH_CUDA_ALLOC_CONF: backend must be native or cudaMallocAsync, got {b!r}")
    for key, v in one.items():
        c = CONF_KEYS[key]
        if not c.affects_bytes:
            if c.kind == "bool":
                _bool(key, v)
            elif c.kind == "int":
                _int(key, v)
            notes.append(f"{key}:{v} changes speed or error reporting, not the bytes held; memfit ignores it")
    if kw.get("pinned_max_round_threshold", SIZE_MAX) > kw.get("pinned_max_cached_size", SIZE_MAX):
        notes.append("pinned_max_round_threshold_mb > pinned_max_cached_size_mb: the cache limit takes precedence "
                     "(allocations above it are never rounded up), as torch warns")
    if kw.get("garbage_collection_threshold") and kw.get("per_process_memory_fraction") is None:
        notes.append("garbage_collection_threshold acts only once a memory fraction is set "
                     "(CUDACachingAllocator.cpp: malloc, `set_fraction && garbage_collection_threshold() > 0`)")
    return AllocConf(text=text, notes=tuple(notes), **kw)  # type: ignore[arg-type]
