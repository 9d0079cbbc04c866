"""A ``Timeline`` that keeps only what the verdict needs: per phase the GPU peak per rank, the host
peak per process, the host peak per node and the NVMe peak, without the per-item snapshots that
make the full ledger's tables (``Timeline._snapshot`` at every new peak is most of its cost).

The recipes run unchanged on it, so its peaks are the full timeline's by construction;
``tests/core/test_recommend.py`` checks them equal anyway (the node figure needs the rank-0-only
bytes at the host peak, which this class tracks separately).
"""

from __future__ import annotations

from memfit.core.ledger.timeline import HOST, Timeline
from memfit.core.ledger_types import Device


class LeanTimeline(Timeline):
    def __init__(self, *, ranks_per_node: int, accelerator: str = "cuda") -> None:
        super().__init__(ranks_per_node=ranks_per_node, accelerator=accelerator)
        self._out: list[tuple[int, int, int, int]] = []
        self._cur: list[int] | None = None  # [gpu peak, host peak, rank0 at host peak, nvme peak]
        self._rank0 = 0
        self._host = 0

    def phase(self, name: str, description: str) -> None:
        self._close()
        self._cur = [-1, -1, 0, -1]
        self._names.append(name)
        self._observe()
        for fn in self._hooks.pop(name, ()):  # Timeline.at_phase (e.g. cuBLAS's workspace at the first forward)
            fn()

    def end_phase(self) -> None:
        pass

    def alloc(self, key: str, nbytes: int) -> None:
        # the hot path of the recommender's torch search: _observe inlined, and only the device that
        # grew is compared with its peak (the others cannot have passed theirs: frees only lower them)
        if nbytes == 0:
            return
        meta = self._meta[key]
        live = self._live
        live[key] = live.get(key, 0) + nbytes
        dev = meta.device
        dev_live = self._dev_live
        now = dev_live[dev] = dev_live[dev] + nbytes
        cur = self._cur
        if dev is Device.GPU:
            if cur is not None and now > cur[0]:
                cur[0] = now
        elif dev is Device.NVME:
            if cur is not None and now > cur[3]:
                cur[3] = now
        else:  # HOST
            host = self._host = self._host + nbytes
            if meta.rank0_only:
                self._rank0 += nbytes
            if cur is not None and host > cur[1]:
                cur[1] = host
                cur[2] = self._rank0

    def alloc_many(self, key: str, sizes) -> None:  # noqa: ANN001
        alloc = self.alloc
        for n in sizes:
            alloc(key, n)

    def free(self, key: str, nbytes: int | None = None) -> None:
        live = self._live.get(key, 0)
        nbytes = live if nbytes is None else nbytes
        if nbytes > live:
            raise AssertionError(f"ledger bug: freeing {nbytes} B of {key} with {live} B live")
        if nbytes == 0:
            return
        meta = self._meta[key]
        self._live[key] = live - nbytes
        self._dev_live[meta.device] -= nbytes
        if meta.device in HOST:
            self._host -= nbytes
            if meta.rank0_only:
                self._rank0 -= nbytes

    def _observe(self) -> None:
        cur = self._cur
        if cur is None:
            return
        gpu = self._dev_live[Device.GPU]
        if gpu > cur[0]:
            cur[0] = gpu
        if self._host > cur[1]:
            cur[1] = self._host
            cur[2] = self._rank0
        nvme = self._dev_live[Device.NVME]
        if nvme > cur[3]:
            cur[3] = nvme

    def _close(self) -> None:
        if self._cur is not None:
            g, h, r0, n = self._cur
            h = max(h, 0)
            self._out.append((max(g, 0), h, (h - r0) * self.ranks_per_node + r0, max(n, 0)))
            self._cur = None

    @property
    def _names(self) -> list[str]:
        if not hasattr(self, "_phase_names"):
            self._phase_names: list[str] = []
        return self._phase_names

    def peaks(self) -> tuple[tuple[str, int, int, int, int], ...]:
        """Per phase (name, GPU peak per rank, host peak per process, host peak per node, NVMe peak)."""
        self._close()
        return tuple((n, *p) for n, p in zip(self._names, self._out))
