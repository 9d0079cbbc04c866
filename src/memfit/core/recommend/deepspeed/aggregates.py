"""Per-scenario sums over the parameters, computed once, that the fast estimator combines.

The exact ledger (``memfit.core.ledger``) walks the parameters one by one for every plan (5-20 ms);
the search evaluates tens of thousands of candidates that share the same model, PEFT method and
world size ``W``. Everything that depends only on those is summed here once:

- totals: ``N`` (all params), ``N_base`` (loaded by from_pretrained), ``N_ad`` (created by PEFT, in
  fp32), ``C = sum ceil(p/W)`` (ZeRO-3 partitions), the optimized params' ``n_tr``, their sub groups
  (``stage3.py _create_fp16_sub_groups``) and ZeRO-1/2 flat size ``S = ceil(n_tr/2W) x 2W``;
- *loop peaks*: where a recipe loops over parameters allocating and freeing (the per-param cast,
  the per-param partitioning, the zero.Init build), the transient peak depends on the order of the
  params. Each such loop is reduced to ``(peak above the start, net change)`` per device, in
  elements (scaled by a dtype size later) or in bytes where dtypes mix, memoized per variant.

Glossary: *opt params* are the params that get optimizer partitions
(``memfit.core.ledger.deepspeed.zero3.optimized_params``); a *loop* is a ``(gpu_max, host_max, gpu_net,
host_net)`` tuple relative to the state before the loop.
"""

from __future__ import annotations

from dataclasses import field

from memfit.core.lean_dataclass import dataclass
from memfit.core.activations.analytic import estimate_activation_bytes
from memfit.core.dsconfig import optimizer_states_per_param
from memfit.core.ledger.context import DTYPE_BYTES, ceil_div, is_adapter_param
from memfit.core.ledger.deepspeed.module_order import flow_flags
from memfit.core.ledger.deepspeed.step_activations import ActivationPlan
from memfit.core.ledger.deepspeed.step_segments import (GatherPass, GradSpec, Segment, StepLayout, build_layout, gather_pass,
                                                        gather_passes_offloaded_and_not, grad_pass)
from memfit.core.ledger.deepspeed.zero012 import grads_in_partition_numel
from memfit.core.ledger.deepspeed.zero3 import split_sub_groups
from memfit.core.ledger.deepspeed.zero3_fetch import GParam, persistent_flags
from memfit.core.scenario.types import Scenario

Loop = tuple[int, int, int, int, int, int]
"""``(gpu_max, host_max, nvme_max, gpu_net, host_net, nvme_net)``: highest point above the start on
each device while the loop runs, and where each device ends relative to the start."""

MIN_AIO_BYTES = 1024**2
"""DeepSpeed's ``swap_tensor/constants.py``: partitions smaller than this are not swapped to NVMe
(``memfit.core.ledger.deepspeed.zero3.MIN_AIO_BYTES``)."""


def _scan(steps: list[tuple[int, int, int]]) -> Loop:
    """Walk ``(gpu_delta, host_delta, nvme_delta)`` steps; every state after a step is a candidate
    peak (an observation of a state that is not a real peak is harmless: it is never above the true
    peak)."""
    g = h = n = gmax = hmax = nmax = 0
    for dg, dh, dn in steps:
        g += dg
        h += dh
        n += dn
        if g > gmax:
            gmax = g
        if h > hmax:
            hmax = h
        if n > nmax:
            nmax = n
    return gmax, hmax, nmax, g, h, n


def _to_remote(c: int, remote: str) -> list[tuple[int, int, int]]:
    """``z3.pin`` of ``c`` bytes on the remote device: the GPU, pinned host memory (through an unpinned
    staging copy) or pageable host memory, or NVMe (written through the swapper's pinned pool)."""
    if remote == "gpu":
        return [(c, 0, 0)]
    if remote == "pinned":
        return [(0, c, 0), (0, c, 0), (0, -c, 0)]
    if remote == "nvme":
        return [(0, 0, c)]
    return [(0, c, 0)]


@dataclass(slots=True)
class ScenarioAggregates:
    """Sums over one scenario's parameters at its world size (see the module docstring)."""

    scenario: Scenario
    world: int
    ranks_per_node: int
    numels: tuple[int, ...]
    adapters: tuple[bool, ...]
    trainable: tuple[bool, ...]
    names: tuple[str, ...]
    n_total: int
    n_base: int
    n_adapter: int
    n_trainable: int
    parts_total: int
    """``C = sum over params of ceil(p/W)``."""
    largest_module: int
    """Elements of the largest module (params directly owned), as ``ledger.step._modules``."""
    buffer_bytes: int
    """Module buffers in their own dtypes (``ModelShape.buffer_bytes``; never partitioned)."""
    memo: dict = field(default_factory=dict)
    """Per-scenario caches of the loops and of the estimator's initialize phases, by variant."""

    @classmethod
    def from_scenario(cls, sc: Scenario) -> ScenarioAggregates:
        W = sc.world_size
        ps = sc.model.params
        numels = tuple(p.numel for p in ps)
        adapters = tuple(is_adapter_param(p.name) for p in ps)
        trainable = tuple(p.trainable for p in ps)
        mods: dict[str, int] = {}
        for p in ps:
            mod = p.name.rsplit(".", 1)[0] if "." in p.name else ""
            mods[mod] = mods.get(mod, 0) + p.numel
        n_ad = sum(n for n, a in zip(numels, adapters) if a)
        return cls(scenario=sc, world=W, ranks_per_node=sc.hardware.gpus_per_node, numels=numels,
                   adapters=adapters, trainable=trainable, names=tuple(p.name for p in ps),
                   n_total=sum(numels), n_base=sum(numels) - n_ad, n_adapter=n_ad,
                   n_trainable=sum(n for n, t in zip(numels, trainable) if t),
                   parts_total=sum(ceil_div(n, W) for n in numels), largest_module=max(mods.values()),
                   buffer_bytes=sc.model.buffer_bytes)

    def _cached(self, key, build):
        memo = self.memo
        if key not in memo:
            memo[key] = build()
        return memo[key]

    # -- the optimized params (depend on the DeepSpeed version only) ------------------------
    def opt_summary(self, ds_version: str) -> OptSummary:
        """The optimized params, summed (memoized; on the hot path)."""
        v = self.memo.get(("optsum", ds_version))
        if v is None:
            v = self.memo[("optsum", ds_version)] = self._opt_summary(ds_version)
        return v

    def opt_indices(self, ds_version: str) -> tuple[int, ...]:
        """``zero3.optimized_params``: every passed param in 0.5/0.6 with ``model_parameters=all``,
        else the trainable ones."""
        def build():
            from memfit.core.stack.deepspeed import optimizes_frozen_params

            sc = self.scenario
            if sc.train.model_parameters == "all" and optimizes_frozen_params(ds_version, sc.versions.deepspeed,
                                                                               sc.deepspeed.zero.stage):
                return tuple(range(len(self.numels)))
            return tuple(i for i, t in enumerate(self.trainable) if t)
        return self._cached(("opt", ds_version), build)

    def _opt_summary(self, ds_version: str) -> OptSummary:
        idx = self.opt_indices(ds_version)
        W = self.world
        if not idx:
            return OptSummary(count=0, n_tr=0, groups=(), n_part=0, part_max=0, numel_max=0,
                              first_is_adapter=False, flat_numel=0)
        parts = [ceil_div(self.numels[i], W) for i in idx]
        return OptSummary(count=len(idx), n_tr=sum(self.numels[i] for i in idx),
                          groups=tuple(split_sub_groups(parts, self.scenario.deepspeed.zero.sub_group_size)),
                          n_part=sum(parts), part_max=max(parts), numel_max=max(self.numels[i] for i in idx),
                          first_is_adapter=self.adapters[idx[0]],
                          flat_numel=ceil_div(sum(self.numels[i] for i in idx), 2 * W) * 2 * W)

    # -- loops ------------------------------------------------------------------------------
    def cast_loop(self, load_dtype: str, precision: str) -> Loop:
        """``load.record_cast`` in bytes: each param not already in the training dtype gets a new
        copy, then its old storage is freed (base params as loaded, PEFT params in fp32)."""
        def build():
            nb = DTYPE_BYTES[precision]
            steps = []
            for n, ad in zip(self.numels, self.adapters):
                dtype = "fp32" if ad else load_dtype
                if dtype == precision:
                    continue
                steps.append((0, n * nb, 0))
                steps.append((0, -n * DTYPE_BYTES[dtype], 0))
            return _scan(steps)
        return self._cached(("cast", load_dtype, precision), build)

    def buffer_cast_loop(self, precision: str) -> Loop:
        """``load.record_cast`` in DeepSpeed 0.5/0.6 (``module.half()``): floating buffers not in the
        training dtype are cast too, one at a time, in bytes."""
        def build():
            nb = DTYPE_BYTES[precision]
            steps = []
            for b in self.scenario.model.buffers:
                if b.is_floating and b.dtype != precision:
                    steps += [(0, b.numel * nb, 0), (0, -b.nbytes, 0)]
            return _scan(steps)
        return self._cached(("bufcast", precision), build)

    def partition_loop(self, remote: str, nb: int, nvme: bool) -> Loop:
        """``zero3.record_partition`` after the whole-model move, in bytes: per param, ``ceil(p/W)``
        elements of ``nb`` bytes on the remote device (``gpu``, ``pinned``, ``pageable``; with
        ``nvme``, partitions of at least ``MIN_AIO_BYTES`` go to NVMe instead), then the whole param
        freed from the GPU."""
        def build():
            W = self.world
            steps = []
            for n in self.numels:
                c = ceil_div(n, W) * nb
                steps += _to_remote(c, "nvme" if nvme and c >= MIN_AIO_BYTES else remote)
                steps.append((-n * nb, 0, 0))
            return _scan(steps)
        return self._cached(("part", remote, nb, nvme), build)

    def zero_init_build_loop(self, remote: str) -> Loop:
        """``load.record_load_zero_init`` (the build), in elements of the training dtype: base params
        grouped by module (``name.rsplit('.', 1)[0]``); each module created whole on the GPU, then each
        param partitioned to the remote device and its whole copy freed."""
        def build():
            W = self.world
            steps = []
            for ps in self._zi_modules():
                steps += [(n, 0, 0) for n in ps]
                for n in ps:
                    steps += _to_remote(ceil_div(n, W), remote)
                    steps.append((-n, 0, 0))
            return _scan(steps)
        return self._cached(("zibuild", remote), build)

    def zero_init_largest_gathered_module(self) -> int:
        """Largest ``sum ceil(p/W) x W`` over the params of one module in one checkpoint shard,
        gathered together while that shard is loaded (``load.record_load_zero_init``)."""
        def build():
            from memfit.core.checkpoint import checkpoint_key

            W = self.world
            layout = self.scenario.load.checkpoint
            shard_of = layout.shard_of() if layout is not None else {}
            best = 0
            mods: dict[tuple[str, int], int] = {}
            for name, n, ad in zip(self.names, self.numels, self.adapters):
                if ad:
                    continue
                shard = shard_of.get(checkpoint_key(name), -1) if layout is not None else 0
                if shard < 0:
                    continue  # not in the checkpoint: not loaded
                key = (name.rsplit(".", 1)[0], shard)
                mods[key] = mods.get(key, 0) + ceil_div(n, W) * W
                best = max(best, mods[key])
            return best
        return self._cached(("zigather",), build)

    def host_load_bytes(self) -> int:
        """``deepspeed/build.record_process``: the process's imports, tokenizer and dataset."""
        from memfit.core.ledger import host_process

        sc = self.scenario
        return self._cached(("hostload",), lambda: host_process.total(
            host_process.load_parts(sc.model.arch.vocab_size, sc.train.dataset_tokens)))

    def heap_kept_bytes(self, load_bytes: int) -> int:
        """``load.record_heap_kept`` after a shard-by-shard load."""
        from memfit.core.ledger import host_process
        from memfit.core.ledger.host_process import MMAP_THRESHOLD_MAX

        def build():
            layout = self.scenario.load.checkpoint
            # load.small_freed_bytes: the shards after the first (one file: none)
            sizes = [b for shard in layout.shards[1:] for _, b in shard] if layout is not None else []
            part = host_process.heap_kept_part(sum(b for b in sizes if b < MMAP_THRESHOLD_MAX))
            return part.bytes if part is not None else 0
        return self._cached(("heapkept", load_bytes), build)

    def largest_shard_bytes(self, load_bytes: int) -> int:
        """``load.checkpoint_shards``: the largest shard (without a layout: every base param in the
        load dtype)."""
        layout = self.scenario.load.checkpoint
        if layout is None:
            return self.n_base * load_bytes
        return self._cached(("largest-shard",), lambda: layout.largest_shard_bytes)

    def non_pytorch(self):  # noqa: ANN201 (NonPytorch)
        """``alloc.non_pytorch.non_pytorch_for`` of the scenario (memoized: the candidates share it)."""
        from memfit.core.alloc.non_pytorch import non_pytorch_for

        return self._cached(("non-pytorch",), lambda: non_pytorch_for(self.scenario))

    def _zi_modules(self) -> list[list[int]]:
        def build():
            mods: dict[str, list[int]] = {}
            for name, n, ad in zip(self.names, self.numels, self.adapters):
                if not ad:
                    mods.setdefault(name.rsplit(".", 1)[0], []).append(n)
            return list(mods.values())
        return self._cached(("zimods",), build)

    def adapter_partition_loop(self, new: bool, remote: str, nvme: bool) -> Loop:
        """``zero3.record_partition`` under zero.Init, in bytes: only the PEFT params (created fp32
        outside Init) are converted. 0.19 moves each to the GPU first (``param.data.to(local_device)``);
        0.5/0.6 partition it where it sits. With ``nvme``, partitions of at least ``MIN_AIO_BYTES``
        go to NVMe."""
        def build():
            W = self.world
            steps = []
            for n, ad in zip(self.numels, self.adapters):
                if not ad:
                    continue
                c4, n4 = ceil_div(n, W) * 4, n * 4
                if new:
                    steps.append((n4, -n4, 0))
                    src = (-n4, 0, 0)
                else:
                    src = (0, -n4, 0)
                steps += _to_remote(c4, "nvme" if nvme and c4 >= MIN_AIO_BYTES else remote)
                steps.append(src)
            return _scan(steps)
        return self._cached(("adpart", new, remote, nvme), build)

    def opt_nvme_numel(self, ds_version: str, zero_init: bool, nb: int) -> int:
        """Elements of the optimized params' partitions that went to NVMe (param offload to NVMe):
        those of at least ``MIN_AIO_BYTES`` when partitioned; under zero.Init only PEFT params (fp32)
        are partitioned by the engine, the rest by zero.Init onto the host."""
        def build():
            W = self.world
            total = 0
            for i in self.opt_indices(ds_version):
                c = ceil_div(self.numels[i], W)
                if zero_init:
                    if self.adapters[i] and c * 4 >= MIN_AIO_BYTES:
                        total += c
                elif c * nb >= MIN_AIO_BYTES:
                    total += c
            return total
        return self._cached(("optnvme", ds_version, zero_init, nb), build)

    def master_loop(self, ds_version: str, tmp_bytes: int) -> int:
        """``zero3.record_optimizer`` step 2 on the master's device: highest point (bytes) while the
        fp32 master is built sub group by sub group with a conversion temporary of ``tmp_bytes``
        per element (0.19: the previous temporary dies when the next is made; 0.5/0.6: each dies at
        once). Ends at ``4 x n_part`` (the temporaries freed)."""
        def build():
            groups = self.opt_summary(ds_version).groups
            steps: list[tuple[int, int, int]] = []
            prev = 0
            for n in groups:
                steps.append((0, n * tmp_bytes, 0))
                if ds_version == "0.19":
                    steps.append((0, -prev, 0))
                    prev = n * tmp_bytes
                steps.append((0, n * 4, 0))
                if ds_version != "0.19":
                    steps.append((0, -n * tmp_bytes, 0))
            return _scan(steps)[1]
        return self._cached(("master", ds_version, tmp_bytes), build)

    def grads_pin_loop(self, ds_version: str, pinned: bool) -> int:
        """``initialize_optimizer_states``: fp32 gradient partitions pinned one sub group at a time
        (a staging copy each); highest point in bytes. Ends at ``4 x n_part``."""
        def build():
            steps: list[tuple[int, int, int]] = []
            for n in self.opt_summary(ds_version).groups:
                steps += _to_remote(4 * n, "pinned" if pinned else "pageable")
            return _scan(steps)[1]
        return self._cached(("gradpin", ds_version, pinned), build)

    def persistent_numel(self, threshold: int, ds_version: str) -> int:
        """``sum ceil(p/W) x W`` over the params ZeRO-3 keeps whole on every GPU: ``p <= threshold``
        (0.19; ``<`` in 0.5/0.6), capped by ``model_persistence_threshold`` in param order."""
        def build():
            W = self.world
            cap = self.scenario.deepspeed.zero.model_persistence_threshold
            running = total = 0
            for n in self.numels:
                if not (n <= threshold if ds_version == "0.19" else n < threshold):
                    continue
                if running + n > cap:
                    continue
                running += n
                total += ceil_div(n, W) * W
            return total
        return self._cached(("persist", threshold, ds_version), build)

    def states_per_param(self, cpu_optimizer: bool) -> int:
        opt = self.scenario.deepspeed.optimizer
        return self._cached(("states", cpu_optimizer), lambda: optimizer_states_per_param(
            opt.type, dict(opt.params), cpu_optimizer=cpu_optimizer))

    def adapter_activations(self, dtype_bytes: int):  # noqa: ANN201 (AdapterActivations | None)
        """``ledger.deepspeed.step.deepspeed_adapters`` for this scenario, memoized."""
        from memfit.core.ledger.deepspeed.step import deepspeed_adapters

        return self._cached(("adapters", dtype_bytes), lambda: deepspeed_adapters(self.scenario, dtype_bytes))

    def activation_bytes(self, *, micro_batch: int, dtype_bytes: int, checkpointing: bool,
                         linear_saves_frozen_inputs: bool, float16: bool = False) -> int:
        """``memfit.core.activations.analytic.estimate_activation_bytes`` for this scenario, memoized
        (``float16``: the candidate's precision is fp16, as ``ledger.deepspeed.step.activation_estimate`` says)."""
        sc = self.scenario

        def build():
            return estimate_activation_bytes(sc.model.arch, sc.peft, seq_len=sc.train.seq_len, micro_batch=micro_batch,
                                             dtype_bytes=dtype_bytes, gradient_checkpointing=checkpointing,
                                             attention=sc.train.attention, target_len=sc.train.target_len,
                                             linear_saves_frozen_inputs=linear_saves_frozen_inputs,
                                             adapters=self.adapter_activations(dtype_bytes),
                                             kernels=sc.accelerator, float16=float16).total_bytes
        return self._cached(("act", micro_batch, dtype_bytes, checkpointing, linear_saves_frozen_inputs, float16), build)

    def zero1_outside_numel(self, ds_version: str, partition: int) -> int:
        """``step._Step.grads_outside_partition``: elements of the trained params that start at or
        after rank 0's partition of the flat buffer (their full gradients go first at the step)."""
        def build():
            total, start = 0, 0
            for i in self.opt_indices(ds_version):
                if start >= partition and self.trainable[i]:
                    total += self.numels[i]
                start += self.numels[i]
            return total
        return self._cached(("z1out", ds_version, partition), build)

    def grads_in_partition_numel(self, ds_version: str, partition: int) -> int:
        """``zero012.grads_in_partition_numel``: ZeRO-2's contiguous gradient buffer, the optimized
        params that start in rank 0's partition, whole."""
        def build():
            idx = self.opt_indices(ds_version)
            return grads_in_partition_numel([self.numels[i] for i in idx], partition, [self.trainable[i] for i in idx])
        return self._cached(("gip", ds_version, partition), build)

    # -- the step (``ledger.step``): per-segment numbers, memoized per the settings they depend on
    def layout(self, checkpointing: bool) -> StepLayout:
        arch = self.scenario.model.arch

        def build():
            return build_layout(self.names, self.numels, self.trainable,
                                num_layers=arch.num_layers + arch.num_encoder_layers, checkpointing=checkpointing,
                                **flow_flags(arch, self.scenario.peft.method))
        return self._cached(("layout", checkpointing), build)

    def activation_segments(self, *, micro_batch: int, dtype_bytes: int, checkpointing: bool,
                            linear_saves_frozen_inputs: bool, float16: bool = False) -> StepActivations:
        """``ledger.step.ActivationPlan`` as per-segment sums (see ``StepActivations``); ``float16`` as in
        ``activation_bytes``."""
        key = ("actseg", micro_batch, dtype_bytes, checkpointing, linear_saves_frozen_inputs, float16)
        v = self.memo.get(key)
        if v is not None:
            return v
        sc = self.scenario
        arch = sc.model.arch
        est = estimate_activation_bytes(arch, sc.peft, seq_len=sc.train.seq_len, micro_batch=micro_batch,
                                        dtype_bytes=dtype_bytes, gradient_checkpointing=checkpointing,
                                        attention=sc.train.attention, target_len=sc.train.target_len,
                                        linear_saves_frozen_inputs=linear_saves_frozen_inputs,
                                        adapters=self.adapter_activations(dtype_bytes), kernels=sc.accelerator,
                                        float16=float16)
        lay = self.layout(checkpointing)
        plan = ActivationPlan(est, lay.blocks, lay.n_segments, dtype_bytes, checkpointing,
                              arch.num_layers + arch.num_encoder_layers)
        forward, live = [], 0
        for s in range(lay.n_segments):  # the highest point of each segment's own tensors
            top = live
            for _, b in plan.fwd[s]:
                live += b
                top = max(top, live)
            forward.append(top)
        after = live
        for _, b in plan.fwd_after[-1]:  # the loss, with the params gathered at the end of the forward
            live += b
            after = max(after, live)
        total = live
        backward, before, pre, post = [], live, [], []
        for s in range(lay.n_segments + 1):
            for _, b in plan.bwd_pre[s]:  # the loss's backward, before anything is fetched or reduced
                live += b
                before = max(before, live)
            pre.append(live)
            backward.append(live + plan.recompute[s])
            live += sum(b for _, b in plan.bwd_free[s])
            post.append(live)
        v = self.memo[key] = StepActivations(total=total, forward=tuple(forward), backward=tuple(backward),
                                             after_forward=after, before_backward=before,
                                             backward_pre=tuple(pre), backward_post=tuple(post))
        return v

    def element_bytes(self, precision: str, load_dtype: str, zero_init: bool) -> tuple[int, ...]:
        """Per param, the element size it trains in (``ledger.step.param_element_bytes``): the
        training dtype after DeepSpeed's cast (fp16/bf16), else as loaded (PEFT params in fp32);
        under zero.Init the base params are built in the training dtype, PEFT params stay fp32."""
        def build():
            nb = DTYPE_BYTES[precision]
            if zero_init:
                return tuple(4 if a else nb for a in self.adapters)
            if precision != "fp32":
                return tuple(nb for _ in self.numels)
            return tuple(4 if a else DTYPE_BYTES[load_dtype] for a in self.adapters)
        return self._cached(("eb", precision, load_dtype, zero_init), build)

    def gather(self, *, eb: tuple[int, ...], threshold: int, ds_version: str, checkpointing: bool,
               prefetch: int, max_live: int, offload_copy: bool, complete: bool,
               persistent_available: bool) -> tuple[GatherPass, int, int, int]:
        """``step_segments.gather_pass`` for these settings; the bytes ``stage3.py:_post_step``
        gathers after the step if nothing else were released (0.5: the persistent params the pass left
        released); the persistent params' bytes the pass leaves gathered; all of theirs, gathered."""
        if not complete:  # a RECORD pass neither prefetches nor keeps anything: the limits play no role
            prefetch = max_live = 0
        key = ("gather", eb, threshold, ds_version, checkpointing, prefetch, max_live, offload_copy, complete,
               persistent_available)
        v = self.memo.get(key)
        if v is not None:
            return v
        z = self.scenario.deepspeed.zero
        flags, flags_id = self._persistent(threshold, ds_version)
        # The pass depends on the threshold only through the flags it gives, and on max_live only
        # through a prefetch's budget min(max_live - n_available, prefetch): none without a prefetch,
        # and always the prefetch once max_live >= n_total + prefetch (n_available never exceeds
        # n_total: each param counts once, from its gather to its release). Settings the pass cannot
        # tell apart share one run (zero3_fetch.Coordinator.fetch).
        live_key = 0 if prefetch <= 0 else min(max_live, self.n_total + prefetch)
        same = ("gather=", eb, flags_id, ds_version, checkpointing, prefetch, live_key, offload_copy, complete,
                persistent_available)
        v = self.memo.get(same)
        if v is not None:
            self.memo[key] = v
            return v
        gparams = [GParam(n, e, f) for n, e, f in zip(self.numels, eb, flags)]
        W = self.world
        kw = dict(prefetch_bucket_size=prefetch, max_live_parameters=max_live, max_reuse_distance=z.max_reuse_distance,
                  allgather_sequential=z.allgather_sequential, complete=complete,
                  persistent_available=persistent_available,
                  tables=self._cached(("coordinator-tables", checkpointing), dict))
        lay = self.layout(checkpointing)
        passes = (dict(zip((True, False), gather_passes_offloaded_and_not(lay, gparams, W, **kw))) if W > 1 else
                  {offload_copy: gather_pass(lay, gparams, W, offload_param=offload_copy, **kw)})  # W > 1: one run, both
        for off, gp in passes.items():
            rest = sum((ceil_div(g.numel, W) * W if W > 1 or off else 0) * g.element_bytes
                       for g, live in zip(gparams, gp.persist_live) if g.persist and not live)
            # step._Step._persist_bytes: W = 1 gathers nothing unless the partition is offloaded
            total = sum((ceil_div(g.numel, W) * W if W > 1 or off else 0) * g.element_bytes
                        for g in gparams if g.persist)
            self.memo[same[:7] + (off,) + same[8:]] = (gp, rest, sum(gp.persist_bytes), total)
        v = self.memo[key] = self.memo[same]
        return v

    def _persistent(self, threshold: int, ds_version: str) -> tuple[list[bool], int]:
        """``persistent_flags`` for this threshold, and a small id shared by the thresholds that give
        the same flags."""
        key = ("persist-flags", threshold, ds_version)
        v = self.memo.get(key)
        if v is None:
            flags = persistent_flags(self.numels, threshold, self.scenario.deepspeed.zero.model_persistence_threshold,
                                     inclusive=ds_version == "0.19")
            ids = self.memo.setdefault(("persist-ids",), {})
            v = self.memo[key] = (flags, ids.setdefault(tuple(flags), len(ids)))
        return v

    def grads(self, spec: GradSpec, ds_version: str, checkpointing: bool) -> tuple[tuple[Segment, ...], int,
                                                                                  tuple[int, ...], tuple[int, ...]]:
        """``step_segments.grad_pass``, the gradient bytes it leaves live, its segments' peaks and the
        gradient bytes live at each segment's end (all from the start of the pass)."""
        key = ("grads", spec, ds_version, checkpointing)
        v = self.memo.get(key)
        if v is None:
            opt = set(self.opt_indices(ds_version))
            numels = [n if i in opt else 0 for i, n in enumerate(self.numels)]
            segs = grad_pass(self.layout(checkpointing), numels, spec)
            ends, live = [], 0
            for seg in segs:
                live += sum(b for _, b in seg.events)
                ends.append(live)
            v = self.memo[key] = (segs, live, tuple(g.peak for g in segs), tuple(ends))
        return v


@dataclass(frozen=True, slots=True)
class StepActivations:
    """The step's activations per segment (``ledger.step.ActivationPlan``), summed."""

    total: int
    forward: tuple[int, ...]
    """Per forward segment, the activation bytes live once it has allocated its own."""
    backward: tuple[int, ...]
    """Per backward segment, the activation bytes live while its gradients are made (its recompute
    included)."""
    after_forward: int
    """Highest activation bytes while the loss runs (after the forward's modules: with the params
    gathered at the forward's end)."""
    before_backward: int
    """Highest activation bytes of the loss's backward (before the backward's first fetch or gradient)."""
    backward_pre: tuple[int, ...] = ()
    """Per backward segment, the activation bytes live while its hooks run before its gradients
    (no recompute yet)."""
    backward_post: tuple[int, ...] = ()
    """Per backward segment, the activation bytes live once it has freed its own (its later hooks)."""


@dataclass(frozen=True, slots=True)
class OptSummary:
    """The optimized params, summed."""

    count: int
    n_tr: int
    """Elements of the optimized params."""
    groups: tuple[int, ...]
    """ZeRO-3 sub groups (elements of this rank's partition)."""
    n_part: int
    """``sum ceil(p/W)`` over the optimized params (ZeRO-3)."""
    part_max: int
    """Largest ``ceil(p/W)``."""
    numel_max: int
    """Largest optimized param (``P_max``)."""
    first_is_adapter: bool
    """The first optimized param is PEFT-created (sets ZeRO-3's flat-buffer dtype under zero.Init)."""
    flat_numel: int
    """ZeRO-1/2 flat buffer ``S = ceil(n_tr / 2W) x 2W``."""
