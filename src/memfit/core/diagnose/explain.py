"""What an event usually means and the usual fixes, without a plan."""

from __future__ import annotations

import re

from memfit.core.diagnose.results import MEMORY_KINDS, EventKind, LogEvent
from memfit.core.units import fmt_bytes

GiB = 2**30


# ------------------------------------------------------------------------------------ explaining

def _both(n: int) -> str:
    return f"{fmt_bytes(n)} ({n:,} B)"


def _device_of(ev: LogEvent) -> str:
    return "cpu" if ev.kind in (EventKind.PINNED_HOST_OOM, EventKind.HOST_OOM) else "gpu"


def _explain(ev: LogEvent, phase: str | None, facts=None) -> tuple[list[str], list[str]]:
    """What the event usually means and the usual fixes (without a plan), the fixes from the run's
    own framework (``facts``: ``fixes.RunFacts``; from the log when not given)."""
    say: list[str] = []
    fix: list[str] = []
    n = ev.numbers
    if ev.kind == EventKind.GPU_OOM:
        gpu = f"GPU {ev.gpu_index}" if ev.gpu_index is not None else "the GPU"
        if n and n.tried_to_allocate_bytes is not None:
            s = f"PyTorch's caching allocator asked for {_both(n.tried_to_allocate_bytes)} more on {gpu}"
            if n.free_bytes is not None:
                s += f", which had {_both(n.free_bytes)} free"
            if n.total_capacity_bytes is not None:
                s += f" of {_both(n.total_capacity_bytes)}"
            say.append(s + ".")
        if n and n.allocated_bytes is not None and n.reserved_bytes is not None:
            say.append(f"This process's allocator held {_both(n.reserved_bytes)}: {_both(n.allocated_bytes)} in live "
                       f"tensors and {_both(max(n.reserved_bytes - n.allocated_bytes, 0))} cached but unused.")
        out = n.outside_allocator_bytes if n else None
        if out is not None:
            s = (f"Used outside this process's allocator (total - free - reserved): {_both(out)}: the CUDA context "
                 f"(a few hundred MiB), NCCL and cuBLAS workspaces")
            if n and None not in (n.process_in_use_bytes, n.total_capacity_bytes, n.free_bytes):
                others = max(n.total_capacity_bytes - n.free_bytes - n.process_in_use_bytes, 0)
                s += (f"; this process's non-PyTorch memory is {_both(max(n.process_in_use_bytes - n.reserved_bytes, 0))}, "
                      + (f"other processes hold {_both(others)}" if others > max(3 * n.precision_bytes, 100 * 2**20)
                         else "no other process holds any (a CUDA context alone is over 100 MiB)"))
            else:
                s += ", and any other process on the same GPU"
            say.append(s + ".")
            if out > 2 * GiB:
                fix.append("Something else holds GPU memory: another rank mapped to the same GPU (launch with "
                           "`deepspeed` or `torchrun`, not `python`; check LOCAL_RANK and CUDA_VISIBLE_DEVICES), a "
                           "leftover process or a notebook kernel (nvidia-smi lists them).")
        if n and n.tried_to_allocate_bytes and n.total_capacity_bytes and \
                n.tried_to_allocate_bytes > n.total_capacity_bytes:
            say.append("The single request is larger than the whole GPU: no freeing helps; the tensor must shrink "
                       "(smaller micro-batch or sequence, or it must live elsewhere).")
        if n and n.reserved_unallocated_bytes is not None and n.tried_to_allocate_bytes is not None and \
                n.reserved_unallocated_bytes > max(n.tried_to_allocate_bytes, GiB // 2):
            fix.append("The allocator caches more than the request but in pieces too small (fragmentation): set "
                       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (torch >= 2.1; max_split_size_mb before).")
    elif ev.kind == EventKind.CUDA_ERROR_OOM:
        say.append("A CUDA call outside PyTorch's caching allocator ran out of memory (cuBLAS/cuDNN workspaces, NCCL "
                   "buffers, a custom kernel, or a page-locked host allocation), so there are no figures. CUDA errors "
                   "are reported asynchronously: rerun with CUDA_LAUNCH_BLOCKING=1 to see the call that failed.")
    elif ev.kind == EventKind.PINNED_HOST_OOM:
        say.append("cudaHostAlloc failed: page-locked (pinned) host memory could not be allocated. This is host RAM "
                   "running out, not GPU memory, although CUDA reports it as 'CUDA error: out of memory' (the "
                   "CUDA caching host allocator behind tensor.pin_memory()).")
        say.append("Every rank on a node pins its own buffers, and pinned pages cannot be swapped, so the node's RAM "
                   "must hold all ranks' pinned memory plus everything pageable at once.")
    elif ev.kind == EventKind.HOST_OOM:
        if ev.exit_code is not None:
            say.append("The kernel's OOM killer ended the process (SIGKILL: exit code -9, 137 in a shell) when host "
                       "RAM ran out; a killed process prints no traceback (dmesg shows 'Out of memory: Killed process').")
        else:
            say.append("A host allocation failed: host RAM (or the container's memory limit) ran out.")
        if n and n.tried_to_allocate_bytes is not None:
            say.append(f"The failing request was {_both(n.tried_to_allocate_bytes)}.")
        say.append("Each rank is its own process with its own copy of whatever it loads: from_pretrained builds the "
                   "full model in every rank (fp32 unless told otherwise).")
    elif ev.kind == EventKind.NCCL_ERROR:
        if ev.out_of_memory:
            say.append("NCCL could not allocate its buffers on the GPU (Cuda failure 'out of memory'): the GPU was "
                       "full when a collective started (NCCL allocates outside PyTorch's allocator).")
            fix.append("Leave GPU headroom for NCCL (smaller reduce/allgather buckets, micro-batch), or set "
                       "NCCL_BUFFSIZE lower.")
        else:
            say.append("A collective failed. When one rank dies (out of memory, exception), the others usually "
                       "report an NCCL error or a watchdog timeout: look for the first failure of any rank.")
            if "SystemError" in ev.detail or "shm" in ev.detail or "shared memory" in ev.detail:
                fix.append("ncclSystemError with shared memory: in Docker give /dev/shm room (--shm-size=8g or "
                           "--ipc=host).")
            fix.append("Rerun with NCCL_DEBUG=INFO; for P2P/InfiniBand trouble try NCCL_P2P_DISABLE=1 or "
                       "NCCL_IB_DISABLE=1.")
    elif ev.kind == EventKind.OP_BUILD_ERROR:
        m = re.match(r"(\w+)(?:: (.*))?$", ev.detail)
        op, cause = (m.group(1), m.group(2) or "") if m else ("an op", ev.detail)
        say.append(f"DeepSpeed JIT-compiles its C++/CUDA ops the first time they are used; building {op} failed"
                   + (f" ({cause})" if cause else "") + ". Nothing was allocated yet: this is not a memory failure.")
        if op == "cpu_adam":
            say.append("cpu_adam is DeepSpeedCPUAdam, the optimizer ZeRO-Offload uses for offload_optimizer: cpu.")
        fix.append("Install a CUDA toolkit matching torch.version.cuda, set CUDA_HOME to it, install ninja, and check "
                   "with `ds_report`; or pre-build: DS_BUILD_CPU_ADAM=1 pip install deepspeed --no-cache-dir.")
    if ev.kind in MEMORY_KINDS or ev.out_of_memory:
        from memfit.core.diagnose.fixes import RunFacts, phase_fixes

        fix.extend(phase_fixes(ev, phase, facts or RunFacts(framework=None), host=_device_of(ev) == "cpu"))
    return say, fix
