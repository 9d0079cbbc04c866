"""The fast estimator's running tally: live bytes on the GPU, the host and NVMe and each phase's
peaks, as ``ledger.timeline.Timeline`` keeps them with the items summed away."""

from __future__ import annotations


class Tally:
    """Live bytes on the GPU, the host and NVMe and each phase's peaks (``ledger.timeline.Timeline``
    with the items summed away)."""

    __slots__ = ("g", "gp", "h", "hp", "n", "np", "out", "r0")

    def __init__(self) -> None:
        self.g = self.h = self.n = 0
        self.gp = self.hp = self.np = self.r0 = -1
        self.out: list[tuple[int, int, int, int]] = []

    def phase(self) -> None:
        if self.gp >= 0:
            self.out.append((self.gp, self.hp, self.r0, self.np))
        self.gp, self.hp, self.np, self.r0 = self.g, self.h, self.n, 0

    def gpu(self, n: int) -> None:
        self.g += n
        if self.g > self.gp:
            self.gp = self.g

    def host(self, n: int) -> None:
        self.h += n
        if self.h > self.hp:
            self.hp, self.r0 = self.h, 0

    def nvme(self, n: int) -> None:
        self.n += n
        if self.n > self.np:
            self.np = self.n

    def pin(self, n: int, pinned: bool) -> None:
        """``z3.pin``: a pinned allocation goes through an unpinned staging copy of the same size."""
        if pinned:
            self.host(n)
            self.host(n)
            self.h -= n
        else:
            self.host(n)

    def loop(self, loop: tuple[int, int, int, int, int, int], scale: int = 1) -> None:
        gmax, hmax, nmax, dg, dh, dn = loop
        if self.g + gmax * scale > self.gp:
            self.gp = self.g + gmax * scale
        if self.h + hmax * scale > self.hp:
            self.hp, self.r0 = self.h + hmax * scale, 0
        if self.n + nmax * scale > self.np:
            self.np = self.n + nmax * scale
        self.g += dg * scale
        self.h += dh * scale
        self.n += dn * scale

    def peaks(self, ranks_per_node: int) -> tuple[tuple[int, int, int, int], ...]:
        """Per closed phase: (GPU, host per process, host per node, NVMe)."""
        return tuple((gp, hp, (hp - r0) * ranks_per_node + r0, np) for gp, hp, r0, np in self.out)
