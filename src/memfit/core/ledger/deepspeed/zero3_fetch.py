"""ZeRO-3's parameter coordinator, simulated: which parameters are gathered on the GPU, when.

Mirrors DeepSpeed 0.19.8 ``deepspeed/runtime/zero/partitioned_param_coordinator.py``
(``PartitionedParameterCoordinator``) and the all-gather code it calls in
``partition_parameters.py``, rule by rule, over a fetch order (the modules' forward and backward
hooks in the order the step runs them):

- ``fetch_sub_module``: all-gather the module's own params that are NOT_AVAILABLE
  (``__all_gather_params`` -> ``__all_gather_params_``: ``__n_available_params += ds_numel``), wait
  for them (``__inflight_param_registry.pop(param).wait()``); then, only with a complete trace (the
  second forward on: ``reset_step`` turns RECORD into COMPLETE), pop the module's params off the
  parameter queue and prefetch the next NOT_AVAILABLE params of the recorded order while
  ``numel_prefetching < min(max_live - n_available, prefetch_bucket)``; ``step_id += 1``.
- ``release_sub_module``: in RECORD mode every param of the module is released; with a complete
  trace (``__params_to_release``) persistent params, params the prefetcher already scheduled for a
  later use (``most_recent_step_id_param_fetched_for > step_id``) and params that recur within
  ``max_reuse_distance`` elements of the recorded order are kept. ``__release_param`` frees only
  AVAILABLE params no active module still uses, and ``n_available -= ds_numel``.
- ``all_gather_coalesced``: world size 1 gathers nothing (``_no_gather_coalesced``:
  ``param.data = ds_tensor.to(device)``, a copy only when the partition is offloaded); one param,
  or ``stage3_allgather_sequential``: ``_all_gather_sequential``, one buffer of ``ceil(p/W) x W``
  elements per param that becomes ``param.data``; several: ``_all_gather_dtype`` per dtype, one
  flat buffer of ``sum ceil(p/W) x W`` elements, and at the first ``wait`` every param of the
  handle is copied out of it (``AllGatherCoalescedHandle.wait``: ``torch.cat(partitions)``, p
  elements each); the flat buffer lives until every param of the handle has been popped from the
  in-flight registry.
- With the partitions offloaded, the partitions are first copied to the GPU
  (``p.ds_tensor.to(device)``): for a coalesced gather all of them at once, for ``cat`` into the
  flat buffer; for a sequential one each is the collective's input until the wait.
- ``reset_step`` (start of every forward): ``_clean_inflight_param_registry`` waits for and
  releases whatever is still in flight.

Pure Python, no torch: the ledger (``memfit.core.ledger.deepspeed.step``) drives it over the module order of
``memfit.core.ledger.deepspeed.module_order`` and ``memfit.trace.deepspeed.zero3_step`` over a traced order; the replay
(``memfit.replay.deepspeed.coordinator_log``) logs the real coordinator's numbers at every fetch to check it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Protocol

from memfit.core.lean_dataclass import dataclass

PCO = "deepspeed/runtime/zero/partitioned_param_coordinator.py"
P30 = "deepspeed/runtime/zero/partition_parameters.py"

GATHERED = "zero3.gathered_params"
"""Key of one gathered param's data on the GPU (``param.data`` after the gather)."""
AG_FLAT = "zero3.allgather_flat_buffer"
"""Key of a coalesced all-gather's flat output buffer (``_all_gather_dtype``: ``flat_tensor``)."""
AG_STAGING = "zero3.allgather_partition_copy"
"""Key of an offloaded partition copied to the GPU as the all-gather's input."""
PERSISTENT = "zero3.persistent_params_full"
"""Key of a persistent param's gathered data (never released once gathered with a complete trace)."""

NOT_AVAILABLE, INFLIGHT, AVAILABLE = 0, 1, 2


class Sink(Protocol):
    """Where the simulated allocations go: one call per tensor (``Timeline`` has this shape)."""

    def alloc(self, key: str, nbytes: int) -> None: ...

    def free(self, key: str, nbytes: int) -> None: ...


class NullSink:
    """Counts nothing: the coordinator's own figures (``stats``) are all that is wanted."""

    def alloc(self, key: str, nbytes: int) -> None:
        pass

    def free(self, key: str, nbytes: int) -> None:
        pass


@dataclass(frozen=True, slots=True)
class GParam:
    """One parameter as the coordinator sees it."""

    numel: int
    element_bytes: int
    persist: bool = False


@dataclass(frozen=True, slots=True)
class FetchStat:
    """The coordinator after one ``fetch_sub_module`` (what the replay logs at the same point)."""

    module: int
    forward: bool
    n_available: int
    """``__n_available_params`` (elements), after the fetch and its prefetch."""
    inflight_numel: int
    """Elements of the params still in the in-flight registry."""
    gathered_bytes: int
    """Bytes of gathered data (copies and sequential buffers) of non-persistent params."""
    persistent_bytes: int
    """Bytes of gathered persistent params."""
    flat_bytes: int
    """Bytes of coalesced all-gather flat buffers still alive."""


def persistent_flags(numels: Sequence[int], param_threshold: int, model_threshold: int, *,
                     inclusive: bool = True) -> list[bool]:
    """``parameter_offload.py:mark_persistent_parameters`` (0.19.8): in ``named_parameters`` order,
    skip a param if it would take the running total over ``model_threshold``, else mark it if
    ``numel <= param_threshold`` (``<`` in 0.5/0.6, ``inclusive=False``)."""
    out, total = [], 0
    for n in numels:
        if n + total > model_threshold:
            out.append(False)
            continue
        if n <= param_threshold if inclusive else n < param_threshold:
            out.append(True)
            total += n
        else:
            out.append(False)
    return out


class Coordinator:
    """One forward+backward of ``PartitionedParameterCoordinator`` (see the module docstring).

    ``order`` is the recorded trace (module indices in fetch order) for a COMPLETE-trace step, or
    None for the first (RECORD) step. ``persistent_available`` marks persistent params as already
    gathered (from step 2 on, ``stage3.py:_post_step`` re-gathers them after every step)."""

    def __init__(self, params: Sequence[GParam], modules: Sequence[Sequence[int]], world: int, *,
                 prefetch_bucket_size: int, max_live_parameters: int, max_reuse_distance: int,
                 offload_param: bool, allgather_sequential: bool = False, order: Sequence[int] | None = None,
                 persistent_available: bool = False, sink: Sink | None = None, record_stats: bool = True,
                 externals: Sequence[Sequence[int]] | None = None, tables: dict | None = None) -> None:
        """``tables``: a dict shared by coordinators over the same ``modules``, ``externals``, params'
        numels and ``order`` (a RECORD pass's and a complete one's), in which the tables built from
        those alone (each module's params, the parameter queue, each param's uses, the elements
        before each order position) are kept for the next one instead of rebuilt."""
        self.p = params
        built = tables.get(order is not None) if tables is not None else None
        if built is None:
            own = [tuple(sorted(set(m))) for m in modules]
            ext = [tuple(e) for e in externals] if externals is not None else [()] * len(modules)
            # a module's external params are registered the first time its forward reads them (RECORD);
            # a complete trace was recorded with them
            registered = [order is not None or not e for e in ext]
            mods = [tuple(sorted(set(o) | set(e))) if r else o for o, e, r in zip(own, ext, registered)]
            queue: list[tuple[int, int]] = []  # (param, step id last used at) in recorded order
            uses: list[list[int]] = [[] for _ in params]  # per param, the order positions using it
            cum = [0]  # elements traversed before each order position (the reuse window's walk)
            for step, m in enumerate(order if order is not None else ()):
                for q in mods[m]:
                    queue.append((q, step))
                    uses[q].append(step)
                cum.append(cum[-1] + sum(params[q].numel for q in mods[m]))
            built = (own, ext, registered, mods, queue, uses, cum)
            if tables is not None:
                tables[order is not None] = built
        own, ext, registered, mods, queue, uses, cum = built
        self.own = own
        self.externals = ext
        self.registered = list(registered)  # register() changes these two: this coordinator's own copies
        self.modules = list(mods)
        self.pending: int | None = None
        self.W = world
        self.prefetch = prefetch_bucket_size
        self.max_live = max_live_parameters
        self.reuse = max_reuse_distance
        self.offload = offload_param
        self.sequential = allgather_sequential
        self.sink = sink or NullSink()
        n = len(params)
        self.gathered_bytes = 0
        self.persistent_bytes = 0
        self.flat_bytes = 0
        self.status = [NOT_AVAILABLE] * n
        self.data = [0] * n  # bytes of param.data on the GPU (its key in ``self.key``)
        self.key = [GATHERED] * n
        self.active: list[set[int]] = [set() for _ in range(n)]
        for i, q in enumerate(params):
            if q.persist:
                self.key[i] = PERSISTENT
                if persistent_available:
                    self.status[i] = AVAILABLE
                    self.data[i] = self.gathered_bytes_of(i)
                    self.persistent_bytes += self.data[i]
        self.registry: dict[int, int] = {}  # param -> handle id
        self.handles: dict[int, list] = {}  # handle id -> [params left in the registry, flats, staging, waited]
        self._next_handle = 0
        self.n_available = 0
        self.step_id = 0
        self.complete = order is not None
        self.order = tuple(order) if order is not None else ()
        self.queue = queue  # read only from here on (shared through ``tables``)
        self.uses = uses
        self.cum = cum
        self.record_stats = record_stats
        self.qpos = 0
        self.recent = [-(10**10)] * n  # __most_recent_step_id_param_fetched_for
        self.stats: list[FetchStat] = []

    # ------------------------------------------------------------------ sizes
    def part(self, i: int) -> int:
        return -(-self.p[i].numel // self.W)

    def gathered_bytes_of(self, i: int) -> int:
        """Bytes a gather gives param ``i`` of its own: ``full_bytes``, but with W = 1 nothing
        unless its partition is copied to the device (``_no_gather_coalesced``: ``param.data =
        ds_tensor.data.to(device)``, the partition itself when it is already there)."""
        if self.W == 1:
            return self.p[i].numel * self.p[i].element_bytes if self.offload else 0
        return self.full_bytes(i)

    def full_bytes(self, i: int) -> int:
        """Bytes of a gathered param: ``ceil(p/W) x W`` elements from a sequential gather (its own
        buffer), p from a coalesced one (``torch.cat``) or with W = 1 (the partition itself)."""
        return self.part(i) * self.W * self.p[i].element_bytes

    # ------------------------------------------------------------------ gathering
    def _gather(self, params: Sequence[int]) -> None:
        """``__all_gather_params_``: launch an all-gather of the NOT_AVAILABLE ones."""
        status = self.status
        todo = [q for q in params if status[q] == NOT_AVAILABLE]  # callers pass params sorted
        if not todo:
            return
        p = self.p
        self.n_available += sum(p[q].numel for q in todo)
        hid = self._next_handle
        self._next_handle += 1
        flats: list[int] = []
        staging: list[int] = []
        sink = self.sink
        if self.W == 1:  # _no_gather_coalesced: param.data = ds_tensor.to(device)
            for q in todo:
                self.status[q] = INFLIGHT
                if self.offload:
                    self._set_data(q, self.p[q].numel * self.p[q].element_bytes)
        elif len(todo) == 1 or self.sequential:  # _all_gather_sequential
            for q in todo:
                self.status[q] = INFLIGHT
                if self.offload:  # ds_tensor.to(device): the collective's input until the wait
                    b = self.part(q) * self.p[q].element_bytes
                    sink.alloc(AG_STAGING, b)
                    staging.append(b)
                self._set_data(q, self.full_bytes(q))  # param.data is a view of its buffer
        else:  # _all_gather_coalesced -> _all_gather_dtype, one flat buffer per dtype
            by_dtype: dict[int, list[int]] = {}
            for q in todo:
                self.status[q] = INFLIGHT
                by_dtype.setdefault(self.p[q].element_bytes, []).append(q)
            for eb in sorted(by_dtype, reverse=True):
                group = by_dtype[eb]
                flat = sum(self.part(q) for q in group) * self.W * eb
                sink.alloc(AG_FLAT, flat)
                self.flat_bytes += flat
                flats.append(flat)
                if self.offload:  # torch.cat([p.ds_tensor.to(device) for p in params], out=...)
                    copies = [self.part(q) * eb for q in group]
                    for b in copies:
                        sink.alloc(AG_STAGING, b)
                    for b in copies:
                        sink.free(AG_STAGING, b)
        self.handles[hid] = [set(todo), flats, staging, False, todo]
        registry = self.registry
        for q in todo:
            registry[q] = hid

    def _set_data(self, q: int, nbytes: int) -> None:
        self.sink.alloc(self.key[q], nbytes)
        self.data[q] = nbytes
        if self.p[q].persist:
            self.persistent_bytes += nbytes
        else:
            self.gathered_bytes += nbytes

    def _wait(self, q: int) -> None:
        """``__inflight_param_registry.pop(param).wait()``."""
        hid = self.registry.pop(q, None)
        if hid is not None:
            self._wait_handle(q, hid)

    def _wait_handle(self, q: int, hid: int) -> None:
        """``_wait`` of ``q``, popped from the registry with handle ``hid``."""
        left, flats, staging, waited, members = self.handles[hid]
        if not waited:
            self.handles[hid][3] = True
            for b in staging:
                self.sink.free(AG_STAGING, b)
            for r in members:
                if self.status[r] == INFLIGHT:
                    if flats:  # torch.cat(partitions): p elements, out of the flat buffer
                        self._set_data(r, self.p[r].numel * self.p[r].element_bytes)
                    self.status[r] = AVAILABLE
        left.discard(q)
        if not left:
            for b in flats:
                self.sink.free(AG_FLAT, b)
                self.flat_bytes -= b
            del self.handles[hid]

    def _release(self, q: int) -> None:
        """``__release_param``."""
        if self.status[q] == AVAILABLE and not self.active[q]:
            self.status[q] = NOT_AVAILABLE
            if self.data[q]:
                self.sink.free(self.key[q], self.data[q])
                if self.p[q].persist:
                    self.persistent_bytes -= self.data[q]
                else:
                    self.gathered_bytes -= self.data[q]
                self.data[q] = 0
            self.n_available -= self.p[q].numel

    # ------------------------------------------------------------------ hooks
    def fetch(self, m: int, forward: bool = True) -> None:
        """``fetch_sub_module`` (``_fetch_sub_module_impl``); the first time, the module's forward
        then reads its external params (``register``, done at the next hook)."""
        if self.pending is not None:
            self._registering()
        params = self.modules[m]
        self._gather(params)
        active, registry = self.active, self.registry
        for q in params:
            active[q].add(m)
            hid = registry.pop(q, None)  # _wait(q)
            if hid is not None:
                self._wait_handle(q, hid)
        if not self.registered[m] and forward:
            self.pending = m  # the module's forward runs after this hook
        if self.complete:
            recent, queue, step_id = self.recent, self.queue, self.step_id
            n_queue = len(queue)
            qpos = self.qpos
            not_fetched = {q for q in params if recent[q] < step_id}
            discarded: set[int] = set()
            while qpos < n_queue and len(discarded) < len(not_fetched):
                q, last = queue[qpos]
                qpos += 1
                recent[q] = last
                discarded.add(q)
            if self.prefetch > 0:
                budget = min(self.max_live - self.n_available, self.prefetch)
                chosen: list[int] = []
                seen: set[int] = set()
                numel = 0
                status, p = self.status, self.p
                while qpos < n_queue and numel < budget:
                    q, last = queue[qpos]
                    qpos += 1
                    do = status[q] == NOT_AVAILABLE and q not in seen
                    if last > recent[q]:
                        recent[q] = last
                    if do:
                        seen.add(q)
                        chosen.append(q)
                        numel += p[q].numel
                if chosen:
                    chosen.sort()  # all_gather_coalesced sorts by ds_id
                    self._gather(chosen)
            self.qpos = qpos
        self.step_id += 1
        if not self.record_stats:
            return
        self.stats.append(FetchStat(module=m, forward=forward, n_available=self.n_available,
                                    inflight_numel=sum(self.p[q].numel for q in self.registry),
                                    gathered_bytes=self.gathered_bytes, persistent_bytes=self.persistent_bytes,
                                    flat_bytes=self.flat_bytes))

    def _registering(self) -> None:
        if self.pending is not None:
            m, self.pending = self.pending, None
            self.register(m)

    def register(self, m: int) -> None:
        """``ZeROOrderedDict.__getitem__`` (parameter_offload.py) in module ``m``'s forward: a
        NOT_AVAILABLE param it reads is registered as its external param and gathered at once by
        ``param.all_gather()`` (``Init._all_gather`` -> ``_allgather_params_sequential``: its own
        ``ceil(p/W) x W`` buffer, the offloaded partition copied to the device as the collective's
        input), outside the coordinator's count (``__n_available_params`` is not raised, though the
        release lowers it). From then on the module's hooks fetch and release it."""
        self.registered[m] = True
        self.modules[m] = tuple(sorted(set(self.own[m]) | set(self.externals[m])))
        for q in self.externals[m]:
            if self.status[q] != NOT_AVAILABLE:
                continue
            staging = self.part(q) * self.p[q].element_bytes if self.offload else 0
            if staging:
                self.sink.alloc(AG_STAGING, staging)
            self._set_data(q, self.full_bytes(q))
            if staging:
                self.sink.free(AG_STAGING, staging)
            self.status[q] = AVAILABLE

    def release(self, m: int) -> None:
        """``release_sub_module``."""
        if self.pending is not None:
            self._registering()
        own = self.modules[m]
        if self.complete:
            # __params_to_release: walk order[step_id:] a module at a time until max_reuse_distance
            # elements have been traversed; a module is visited while fewer have been
            start = self.step_id
            end = bisect_left(self.cum, self.cum[start] + self.reuse, lo=start) if start < len(self.order) else start
            end = min(end, len(self.order))
            to_release = []
            p, recent, all_uses = self.p, self.recent, self.uses
            for q in own:
                if p[q].persist or recent[q] > start:
                    continue
                uses = all_uses[q]
                i = bisect_left(uses, start)
                if i < len(uses) and uses[i] < end:
                    continue  # recurs within the reuse window
                to_release.append(q)
        else:
            to_release = own
        active = self.active
        for q in own:
            active[q].discard(m)
        status = self.status
        for q in to_release:
            if status[q] == AVAILABLE and not active[q]:  # _release's test, inlined
                self._release(q)

    def finish(self) -> None:
        """End of the backward (``release_backward_leftovers``) and the next ``reset_step``
        (``_clean_inflight_param_registry``): nothing but persistent params stays gathered
        (persistent ones too in RECORD mode, which released them like any other)."""
        for q in list(self.registry):
            self._wait(q)
        for q in range(len(self.p)):
            self.active[q].clear()
            if not (self.complete and self.p[q].persist):
                self._release(q)

    @property
    def live_bytes(self) -> int:
        return self.gathered_bytes + self.persistent_bytes + self.flat_bytes


def upper_bound_numel(*, chain_numel: int, largest_module: int, largest_param: int, total_numel: int,
                      prefetch_bucket_size: int, max_live_parameters: int, max_reuse_distance: int) -> int:
    """A bound on the gathered elements (param data plus coalesced flat buffers) at any instant,
    from the rules alone, no simulation. Sizes are ``ceil(p/W) x W`` elements (what a gather holds).

    The available, non-persistent params are (a) those of the active module chain (a module and
    its ancestors, ``chain_numel``); (b) params kept at a release because they recur within
    ``max_reuse_distance`` elements of the order: each recurs within that window of the *current*
    point too, and the window is walked a module at a time, so together they are at most
    ``max_reuse_distance + largest module``; (c) prefetched params not yet used: a prefetch runs
    only while ``n_available < max_live`` and stops once it holds ``>= min(max_live - n_available,
    prefetch_bucket)`` elements, so they stay under ``max_live + largest param``. A coalesced flat
    buffer lives until its last member is fetched: the live ones hold (c), the used part of the
    oldest prefetch (``< prefetch_bucket + largest param``) and, inside a fetch, the module's own
    gather (``largest module``). Each part is capped by the model."""
    kept = min(max_reuse_distance + largest_module, total_numel)
    ahead = min(max_live_parameters + largest_param, total_numel) if prefetch_bucket_size > 0 else 0
    oldest = min(prefetch_bucket_size + largest_param, total_numel) if prefetch_bucket_size > 0 else 0
    live = min(chain_numel + kept + ahead, total_numel)
    flats = min(largest_module + ahead + oldest, total_numel)
    return live + flats
