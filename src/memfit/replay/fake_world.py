"""A world of W ranks in one process: torch's fake process group, plus mirrored collective outputs;
and its real counterpart, the W processes torchrun starts.

``join_fake_world`` creates the default process group with torch's ``fake`` backend
(``torch.testing._internal.distributed.fake_pg``: every collective completes at once and moves no
data) and attaches ``deepspeed.comm`` to it. Every size DeepSpeed computes from the world size
(ceil(n/W) partitions, flat buffers padded to W, buckets) is the real one, and so is every
allocation, because DeepSpeed allocates the collectives' output buffers itself.

Data matters in one way: a ZeRO-3 all-gather writes into a fresh ``torch.empty``; if the other
ranks' slices stayed uninitialized, a GPU could hand back any bit pattern, gathered fp16 weights
with inf/NaN would make the loss overflow, and DeepSpeed's fp16 loss scaler would skip the
optimizer step, hiding the optimizer state's memory. torch 2.13's ``FakeProcessGroup`` fills
outputs as if every rank held this rank's data (an all-gather copies the input into every slice, a
reduce-scatter takes this rank's slice). ``join_fake_world`` probes for that and, on a torch whose
fake group leaves outputs untouched, ``mirror_collectives`` wraps the gathering and scattering
methods of DeepSpeed's ``TorchBackend`` to do the same copies. The copies go into the buffers
DeepSpeed allocated, so memory is unchanged; values are finite but not those of a real W-rank run.
Reductions (all-reduce, reduce, broadcast) stay the identity.

``join_real_world`` is what the ``torchrun`` launcher uses instead: ``deepspeed.init_distributed``
on the environment torchrun sets (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), with
the backend DeepSpeed's accelerator names (``CPU_Accelerator.communication_backend_name``: ``ccl``
when oneccl_bindings_for_pytorch imports, else ``gloo``; ``nccl`` on CUDA). The two worlds run
the same recipe, so comparing them (tests/replay/test_multiprocess.py) measures what the fake one
leaves out: the communication library's own buffers.

On gloo, ``hold_finished_work`` keeps the host tracker's count of frees complete (see there).
"""

from __future__ import annotations

import functools
import time

WORK_HOLD_S = 0.002
"""How long ``Work.wait`` keeps the caller holding a finished gloo work object (see
``hold_finished_work``); a few hundred collectives per replay make this well under a second."""


def load_comm_op() -> None:
    """On the CPU accelerator deepspeed.comm loads (JIT-building if needed) its shared-memory
    collectives op when it starts (comm/torch.py ``build_shm_op``), under torch's build lock, which
    it would wait on forever: load it first through ``memfit.replay.ops.load_op``, which reports a
    stale or long-held lock (``BuildLockError``). Any other failure is left to deepspeed.comm."""
    from deepspeed.accelerator import get_accelerator

    from memfit.replay.ops import BuildLockError, load_op

    if get_accelerator().device_name() != "cpu":
        return
    try:
        load_op("deepspeed_shm_comm")
    except BuildLockError:
        raise
    except Exception:  # noqa: BLE001
        return


def join_fake_world(*, rank: int, world_size: int) -> None:
    """Default process group of ``world_size`` ranks with this process as ``rank``; deepspeed.comm on it."""
    import torch.distributed as tdist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not tdist.is_initialized():
        tdist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    import deepspeed

    load_comm_op()
    # Attach deepspeed.comm now (deepspeed.initialize would do it later) so that a zero.Init
    # entered before initialize sees the world size.
    deepspeed.init_distributed(dist_init_required=False)
    from deepspeed import comm

    if world_size > 1 and not fake_group_fills_outputs(world_size):
        mirror_collectives(comm.comm.cdb)


def join_real_world(*, world_size: int) -> tuple[int, str]:
    """This process's rank in the real world torchrun started, and the backend; deepspeed.comm on it.

    ``deepspeed.init_distributed`` creates the default process group from the environment (as
    ``deepspeed.initialize`` would in a user's script). Raises ``RuntimeError`` when the launcher
    started a world of another size than ``world_size``.
    """
    import deepspeed
    import torch.distributed as tdist
    from deepspeed.accelerator import get_accelerator

    load_comm_op()
    deepspeed.init_distributed(dist_backend=get_accelerator().communication_backend_name())
    if tdist.get_world_size() != world_size:
        raise RuntimeError(f"launcher started {tdist.get_world_size()} ranks, the spec asks for {world_size}")
    backend = str(tdist.get_backend())
    if backend == "gloo":
        hold_finished_work()
    return tdist.get_rank(), backend


def hold_finished_work(hold_s: float = WORK_HOLD_S) -> None:
    """Make ``torch.distributed.Work.wait`` return ``hold_s`` after the work completes (idempotent).

    gloo runs every collective on a worker thread (``ProcessGroupGloo::runLoop``) that drops its
    reference to the work object just after marking it complete. When the caller has already
    dropped its own reference by then, the work, and every tensor only it still references (the
    caller's buffers, gloo's clone of a reduce-scatter input), is freed on the worker thread,
    outside the profiler's thread-local scope, and the host tracker never sees the free: measured
    here, 10 to 30 % of the frees after synchronous gloo collectives (torch 2.13), hundreds of KB
    that stay "live" in a replay. The caller sleeping ``hold_s`` inside ``wait`` (c10d's
    synchronous collectives call it too) lets the worker let go first, so the last reference, and
    the free, is the caller's, at the moment the caller drops it. Nothing is allocated while the
    caller sleeps, so the timeline is the one an instantly finishing worker would give. It is a
    delay, not a handshake: a worker descheduled for longer still frees out of the tracker's sight
    (a work never waited on, too), which shows as live bytes that never return.
    """
    import torch.distributed as tdist

    work = tdist.Work
    if getattr(work.wait, "_memfit_hold", False):
        return
    original = work.wait

    @functools.wraps(original)
    def wait(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        time.sleep(hold_s)
        return result

    wait._memfit_hold = True
    work.wait = wait


def fake_group_fills_outputs(world_size: int) -> bool:
    """Whether the default group's all-gather and reduce-scatter write their outputs (probed on a
    few CPU elements)."""
    import torch
    import torch.distributed as tdist

    gathered = torch.full((world_size,), float("nan"))
    tdist.all_gather_into_tensor(gathered, torch.ones(1))
    scattered = torch.full((1,), float("nan"))
    tdist.reduce_scatter_tensor(scattered, torch.ones(world_size))
    return bool(torch.isfinite(gathered).all() and torch.isfinite(scattered).all())


def _group_rank_size(group) -> tuple[int, int]:
    import torch.distributed as tdist

    return tdist.get_rank(group), tdist.get_world_size(group)


def fill_gather(output, inp, rank: int, world_size: int) -> None:
    """Write ``inp`` into each of the ``world_size`` equal slices of ``output`` (flat view)."""
    if world_size <= 1 or not output.is_contiguous():
        return
    flat_out = output.view(-1)
    flat_in = inp.reshape(-1)
    n = flat_in.numel()
    if n == 0 or flat_out.numel() != n * world_size:
        return
    for j in range(world_size):
        dst = flat_out.narrow(0, j * n, n)
        if dst.data_ptr() != flat_in.data_ptr():
            dst.copy_(flat_in)


def fill_scatter(output, inp, rank: int, world_size: int) -> None:
    """Write this rank's slice of ``inp`` to ``output``."""
    if world_size <= 1 or not inp.is_contiguous():
        return
    n = output.numel()
    flat_in = inp.view(-1)
    if n == 0 or flat_in.numel() != n * world_size:
        return
    src = flat_in.narrow(0, rank * n, n)
    if src.data_ptr() != output.data_ptr():
        output.copy_(src.view_as(output))


def _after(method, names: tuple[str, ...], fill):
    """``method`` followed by ``fill`` on its arguments, bound to ``names`` (TorchBackend's parameter
    names; its decorators hide the signature, so it is spelled out here)."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        result = method(*args, **kwargs)
        bound = dict(zip(names, args))
        bound.update(kwargs)
        rank, size = _group_rank_size(bound.get("group"))
        fill(bound, rank, size)
        return result

    return wrapper


def _gather_into(args, rank, size):
    fill_gather(args["output_tensor"], args["input_tensor"], rank, size)


def _gather_list(args, rank, size):
    tensors, tensor = args["tensor_list"], args["tensor"]
    for dst in tensors:
        if dst.data_ptr() != tensor.data_ptr() and dst.shape == tensor.shape:
            dst.copy_(tensor)


def _gather_coalesced(args, rank, size):
    for out, inp in zip(args["output_tensors"], args["input_tensors"]):
        fill_gather(out, inp, rank, size)


def _scatter_tensor(args, rank, size):
    fill_scatter(args["output_tensor"], args["input_tensor"], rank, size)


def _scatter_list(args, rank, size):
    out, inputs = args["output"], args["input_list"]
    if len(inputs) == size and inputs[rank].data_ptr() != out.data_ptr():
        out.copy_(inputs[rank])


_MIRRORS = {
    "all_gather_into_tensor": (("output_tensor", "input_tensor", "group", "async_op"), _gather_into),
    "all_gather_base": (("output_tensor", "input_tensor", "group", "async_op"), _gather_into),
    "all_gather": (("tensor_list", "tensor", "group", "async_op"), _gather_list),
    "all_gather_coalesced": (("output_tensors", "input_tensors", "group", "async_op"), _gather_coalesced),
    "reduce_scatter_tensor": (("output_tensor", "input_tensor", "op", "group", "async_op"), _scatter_tensor),
    "reduce_scatter": (("output", "input_list", "op", "group", "async_op"), _scatter_list),
}
"""TorchBackend (deepspeed/comm/torch.py, 0.19.8) methods: parameter names and the fill."""


def mirror_collectives(backend) -> None:
    """Wrap ``backend``'s (a DeepSpeed ``TorchBackend``) gather/scatter methods, once."""
    if backend is None or getattr(backend, "_memfit_mirrored", False):
        return
    for name, (names, fill) in _MIRRORS.items():
        method = getattr(backend, name, None)
        if method is not None:
            setattr(backend, name, _after(method, names, fill))
    backend._memfit_mirrored = True
