"""The process group and the DDP wrap of a non-DeepSpeed replay (``memfit.replay.pytorch.child``).

``join_world``: with the ``torchrun`` launcher, ``torch.distributed.init_process_group`` from
torchrun's environment (gloo on the CPU, nccl on CUDA), as the Trainer's accelerate does; with the
``fake`` launcher, torch's fake process group (collectives move no data, sizes are real).
``wrap_ddp``: ``DistributedDataParallel`` with the spec's ``DdpSettings`` and the bucket sizes the
reducer reports (``_get_ddp_logging_data``) as the ``ddp.buckets`` item.

Fixtures use the fake process group: gloo runs each collective on a worker thread that sometimes drops
the last reference to a C++ buffer (``_broadcast_coalesced``'s flat bucket in DDP's construction), a
free the profiler's thread-local tracking never sees; a fake collective runs on the calling thread.
The live tests also run real 2-rank gloo worlds under torchrun.
"""

from __future__ import annotations

from memfit.replay.measurement import AttributedItem


def join_world(spec) -> tuple[int, str]:
    import torch.distributed as dist

    if spec.launcher == "torchrun":
        backend = "nccl" if spec.accelerator == "cuda" else "gloo"
        if not dist.is_initialized():
            dist.init_process_group(backend)
        if dist.get_world_size() != spec.world_size:
            raise RuntimeError(f"launcher started {dist.get_world_size()} ranks, the spec asks for {spec.world_size}")
        if backend == "gloo":
            from memfit.replay.fake_world import hold_finished_work

            hold_finished_work()
        return dist.get_rank(), backend
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=spec.rank, world_size=spec.world_size)
    return spec.rank, "fake"


def sync_module_states(model, bucket_bytes: int = 250 * 1024 * 1024) -> None:
    """DDP's ``_sync_module_states`` in Python, for gloo replays: ``comm.cpp:broadcast_coalesced``
    flattens params and buffers into buckets (per dtype, closed once they reach 250 MiB) and
    broadcasts each from rank 0. gloo's worker thread sometimes drops the last reference to the C++
    flat buffer, a free the profiler never sees; here the broadcast waits in Python (held by
    ``hold_finished_work``) and the calling thread frees each flat buffer, with the same sizes. DDP
    then runs with ``init_sync=False``."""
    import torch.distributed as dist
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    tensors = [p.data for p in model.parameters()] + [b for b in model.buffers()]
    buckets: dict = {}
    done: list[list] = []
    for t in tensors:
        cur, size = buckets.get(t.dtype, ([], 0))
        cur.append(t)
        size += t.numel() * t.element_size()
        if size >= bucket_bytes:
            done.append(cur)
            cur, size = [], 0
        buckets[t.dtype] = (cur, size)
    done += [cur for cur, _ in buckets.values() if cur]
    for bucket in done:
        flat = _flatten_dense_tensors(bucket)
        dist.broadcast(flat, src=0)
        for t, synced in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
            t.copy_(synced)
        del flat


def bucket_bytes(ddp, key: str) -> int:
    sizes = ddp._get_ddp_logging_data().get(key) or ""
    return sum(int(s) for s in str(sizes).split(",") if s.strip())


def wrap_ddp(model, spec, items: list):
    import torch

    d = spec.ddp
    kwargs = {"gradient_as_bucket_view": d.get("gradient_as_bucket_view", False),
              "find_unused_parameters": d.get("find_unused_parameters", False),
              "static_graph": d.get("static_graph", False), "broadcast_buffers": d.get("broadcast_buffers", True)}
    if d.get("bucket_cap_mb", 25.0) != 25.0:
        kwargs["bucket_cap_mb"] = d["bucket_cap_mb"]
    device_ids = [torch.cuda.current_device()] if spec.accelerator == "cuda" else None
    if spec.launcher == "torchrun" and spec.accelerator == "cpu":
        sync_module_states(model)
        kwargs["init_sync"] = False
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids, **kwargs)
    if spec.launcher == "fake":
        # torch's fake process group completes an all-reduce with no result, which the reducer refuses;
        # a hook that hands the bucket back as reduced keeps every allocation of the default path (the
        # reducer copies each gradient into its bucket view either way; the all-reduce is in place)
        def reduced(state, bucket):
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut

        ddp.register_comm_hook(None, reduced)
    items.append(AttributedItem(key="ddp.buckets", at="setup", bytes=bucket_bytes(ddp, "bucket_sizes"),
                                count=len(str(ddp._get_ddp_logging_data().get("bucket_sizes", "")).split(",")),
                                device=str(next(model.parameters()).device)))
    return ddp
