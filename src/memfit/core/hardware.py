"""The machines a run has: GPUs per node, nodes, host RAM, and presets for common cards.

Usable capacity is what ``torch.cuda.mem_get_info()`` reports as total on the card (the driver
reserves part of the nominal memory); the CUDA context then takes a few hundred MiB more, which the
ledger lists as its own item. Sizes are bytes; ``GiB`` = 2**30, ``GB`` = 10**9.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

from memfit.core.lean_dataclass import dataclass
from memfit.errors import MemfitError

GiB = 2**30
GB = 10**9
MAX_SIZE_BYTES = 2**60
"""The largest size memfit accepts (1 EiB = 2^60 bytes): no GPU, host or disk comes near it."""
MAX_GPUS_PER_NODE = 1024
"""The most GPUs one node may have (real nodes have 8 or 16)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """One GPU model."""

    name: str
    total_bytes: int
    """Total memory as ``torch.cuda.mem_get_info()[1]`` reports it (what the allocator can reach
    before the CUDA context is created)."""
    bf16: bool = True
    """Supports bfloat16 arithmetic (Ampere and newer)."""
    fp16_tflops: float = 0.0
    """Dense fp16/bf16 tensor-core peak, for ranking recommendations only."""


# total_bytes: the total capacity PyTorch reports for each card (as printed in its OOM messages, e.g.
# "23.69 GiB total capacity" on an RTX 3090); published figures, not measured here.
GPU_PRESETS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec(name="rtx3090", total_bytes=25_438_126_080, bf16=True, fp16_tflops=71.0),
        GpuSpec(name="rtx4090", total_bytes=25_393_692_672, bf16=True, fp16_tflops=165.0),
        GpuSpec(name="a10g", total_bytes=23_836_098_560, bf16=True, fp16_tflops=70.0),
        GpuSpec(name="t4", total_bytes=15_835_660_288, bf16=False, fp16_tflops=65.0),
        GpuSpec(name="v100-16gb", total_bytes=16_945_709_056, bf16=False, fp16_tflops=125.0),
        GpuSpec(name="v100-32gb", total_bytes=34_089_730_048, bf16=False, fp16_tflops=125.0),
        GpuSpec(name="a100-40gb", total_bytes=42_505_273_344, bf16=True, fp16_tflops=312.0),
        GpuSpec(name="a100-80gb", total_bytes=85_097_971_712, bf16=True, fp16_tflops=312.0),
        GpuSpec(name="l40s", total_bytes=47_697_362_944, bf16=True, fp16_tflops=362.0),
        GpuSpec(name="h100-80gb", total_bytes=85_045_346_304, bf16=True, fp16_tflops=989.0),
        GpuSpec(name="h200", total_bytes=150_754_820_096, bf16=True, fp16_tflops=989.0),
    )
}
GPU_ALIASES = {"3090": "rtx3090", "4090": "rtx4090", "a100": "a100-80gb", "h100": "h100-80gb",
               "a100-80g": "a100-80gb", "a100-40g": "a100-40gb", "v100": "v100-32gb"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Hardware:
    """Where the run happens."""

    gpu: GpuSpec
    gpus_per_node: int = 1
    nodes: int = 1
    cpu_ram_bytes: int = 64 * GB
    """Host RAM per node."""
    nvme_bytes: int | None = None
    """Free NVMe space per node for offload (None: not checked)."""
    shared_gpu: bool = False
    """Other processes (a display, other jobs) may hold memory on the cards: "fits" is at risk at best."""
    host_reserve_bytes: int | None = None
    """Host RAM per node kept for the OS and other processes (None: ``verdict.host_reserve_bytes``)."""
    swap_bytes: int = 0
    """Swap space per node: the kernel can page pageable memory out to it (slowly); page-locked
    (pinned) memory stays in RAM."""

    def __post_init__(self) -> None:
        for name in ("gpus_per_node", "nodes", "cpu_ram_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise MemfitError(f"{name} must be a whole number, got {value!r:.60}")
        if self.nvme_bytes is not None and (isinstance(self.nvme_bytes, bool) or not isinstance(self.nvme_bytes, int)
                                            or self.nvme_bytes <= 0):
            raise MemfitError(f"nvme_bytes must be a whole number > 0, got {self.nvme_bytes!r:.60}")
        if self.gpus_per_node > MAX_GPUS_PER_NODE:
            raise MemfitError(f"{self.gpus_per_node} GPUs per node: memfit plans at most {MAX_GPUS_PER_NODE}")
        if self.gpus_per_node < 1 or self.nodes < 1:
            raise MemfitError(f"need at least one GPU and one node, got {self.gpus_per_node} GPUs x {self.nodes} nodes")
        if self.cpu_ram_bytes <= 0:
            raise MemfitError(f"CPU RAM must be positive, got {self.cpu_ram_bytes} bytes")
        if isinstance(self.swap_bytes, bool) or not isinstance(self.swap_bytes, int) or self.swap_bytes < 0:
            raise MemfitError(f"swap_bytes must be a whole number >= 0, got {self.swap_bytes!r:.60}")

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(gib|gb|mib|mb|tib|tb|kib|kb|g|m|t|b|bytes)?\s*$", re.IGNORECASE)
_UNITS = {"gib": GiB, "gb": GB, "mib": 2**20, "mb": 10**6, "tib": 2**40, "tb": 10**12, "kib": 2**10, "kb": 10**3,
          "g": GiB, "m": 2**20, "t": 2**40, "b": 1, "bytes": 1}

DEFAULT_GPU = "a100-80gb"
"""The GPU a scenario that names none is planned on (said as an assumption)."""
DEFAULT_CPU_RAM = "256GB"
"""The host RAM per node a scenario that gives none is planned with (said as an assumption)."""


def parse_size(text: str | int | float, *, what: str = "size") -> int:
    """Parse ``64GB``, ``24GiB``, ``64 g`` (GiB), ``512B`` into bytes (exactly: the number is read as
    a decimal, not a float), from 1 byte to ``MAX_SIZE_BYTES``. A string needs its unit (``64`` alone
    is an error with a hint: GB and GiB differ by 7%, bytes by a factor of 10^9); a Python number
    (the API's ``cpu_ram=64 * 2**30``) is a byte count."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise MemfitError(f"{what}: expected a size like 64GB or 24GiB, got {text!r:.60}")
    if isinstance(text, float) and not math.isfinite(text):
        raise MemfitError(f"{what}: expected a size like 64GB or 24GiB, got {text!r}")
    if isinstance(text, (int, float)):
        value = int(text) if abs(text) <= MAX_SIZE_BYTES else MAX_SIZE_BYTES + 1
    else:
        m = _SIZE.match(text) if len(text) <= 64 else None  # the length cap keeps the match linear
        if not m:
            raise MemfitError(f"{what}: expected a size like 64GB or 24GiB, got {text if len(text) <= 64 else text[:60] + '...'!r}")
        if not m.group(2):
            raise MemfitError(f"{what}: {text.strip()!r} has no unit; write {text.strip()}GB (10^9 bytes) or "
                              f"{text.strip()}GiB (2^30 bytes), or {text.strip()}B for bytes")
        unit = _UNITS[m.group(2).lower()]
        try:
            value = int(Decimal(m.group(1)) * unit)
        except InvalidOperation:
            raise MemfitError(f"{what}: expected a size like 64GB or 24GiB, got {text!r}") from None
    if value <= 0:
        raise MemfitError(f"{what} must be positive, got {text!r}")
    if value > MAX_SIZE_BYTES:
        raise MemfitError(f"{what} is over 1 EiB (2^60 bytes), the most memfit accepts: {text!r:.60}")
    return value


def parse_gpus(text: str) -> tuple[int, GpuSpec]:
    """Parse ``2xrtx3090``, ``8xa100-80gb``, ``2x24GiB``, ``rtx3090`` into (count, GpuSpec)."""
    if not isinstance(text, str) or len(text) > 64:
        raise MemfitError(f"--gpus: expected e.g. 2xrtx3090 or 8xa100-80gb or 2x24GiB, got {text!r:.64}")
    raw = text.strip().lower()
    count_s, sep, kind = raw.partition("x") if re.match(r"^\d+\s*x", raw) else ("1", "", raw)
    try:
        count = int(count_s)
    except ValueError:
        raise MemfitError(f"--gpus: expected e.g. 2xrtx3090 or 8xa100-80gb or 2x24GiB, got {text!r}") from None
    if count < 1:
        raise MemfitError(f"--gpus: need at least one GPU, got {text!r}")
    if count > MAX_GPUS_PER_NODE:
        raise MemfitError(f"--gpus: {count} GPUs per node; memfit plans at most {MAX_GPUS_PER_NODE} (use --nodes)")
    kind = kind.strip()
    kind = GPU_ALIASES.get(kind, kind)
    if kind in GPU_PRESETS:
        return count, GPU_PRESETS[kind]
    if _SIZE.match(kind) and any(ch.isalpha() for ch in kind):
        return count, GpuSpec(name=kind, total_bytes=parse_size(kind, what="--gpus"), bf16=True)
    known = ", ".join(sorted(GPU_PRESETS))
    raise MemfitError(f"--gpus: unknown GPU {kind!r}; use one of {known}, or a size like 2x24GiB")
