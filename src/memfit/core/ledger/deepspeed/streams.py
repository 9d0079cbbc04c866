"""ZeRO-3's side streams, for the CUDA allocator simulation (DeepSpeed 0.19.8, ``overlap_comm``).

With ``overlap_comm`` (ZeRO-3's default) DeepSpeed runs its collectives on streams of their own, and
the CUDA caching allocator files every block under the stream that was current when it was made: a
freed block serves later requests of that stream only (``get_free_block`` compares streams). A tensor
used on another stream is marked with ``record_stream``; its block goes back to the pool only when
that stream's event has completed (``free`` -> ``insert_events``, ``process_events``).

- all-gather stream (``parameter_offload.py``: ``self.__allgather_stream = get_accelerator().Stream()
  if overlap_comm``): ``fetch_sub_module`` issues ``all_gather_coalesced`` and waits for the handles
  inside ``with get_accelerator().stream(self.__allgather_stream)`` (``partitioned_param_coordinator.py``),
  so the coalesced flat buffer, the partitions copied to the GPU under offload_param, and the params'
  gathered data (``AllGatherCoalescedHandle.wait``: ``param.data = torch.cat(partitions)``; or the
  sequential gather's buffer) are all stream-1 blocks. ``free_param`` (``partition_parameters.py``)
  calls ``param.data.record_stream(current_stream())`` from the compute stream before dropping the
  data: the release of a gathered (or persistent) param is deferred.
- reduce stream (``stage3.py``: ``self.reduce_and_partition_stream = get_accelerator().Stream() if
  overlap_comm``): ``__add_grad_to_ipg_bucket`` copies the gradient into the bucket under it and calls
  ``param.grad.record_stream(current_stream())`` before dropping the gradient autograd made (a
  compute-stream block, freed deferred); ``__reduce_and_partition_ipg_grads`` runs the reduce-scatter
  and ``partition_grads`` under it: their flat input and the partition copies are stream-2 blocks.

Only DeepSpeed 0.19 is modelled here (0.5/0.6 keep one stream in the simulation). ZeRO-1/2's
``reduction_stream`` is not modelled. The stream numbers are labels; when a deferred block becomes
reusable is ``core.alloc.tracker.STREAM_EVENT_LAG``.
"""

from __future__ import annotations

from memfit.core.ledger.deepspeed.step_segments import FULL_GRAD, GRAD_COPY, GRAD_FP32, RS_FLAT
from memfit.core.ledger.deepspeed.zero3_fetch import AG_FLAT, AG_STAGING, GATHERED, PERSISTENT
from memfit.core.ledger.timeline import Timeline

ALLGATHER_STREAM = 1
REDUCE_STREAM = 2
STREAM_OF = {GATHERED: ALLGATHER_STREAM, AG_FLAT: ALLGATHER_STREAM, AG_STAGING: ALLGATHER_STREAM,
             PERSISTENT: ALLGATHER_STREAM, RS_FLAT: REDUCE_STREAM, GRAD_COPY: REDUCE_STREAM, GRAD_FP32: REDUCE_STREAM}
DEFERRED = (GATHERED, PERSISTENT, FULL_GRAD)
"""Freed after ``record_stream``: ``free_param`` (gathered and persistent params), ``__add_grad_to_ipg_bucket``
(the gradient autograd made)."""


def zero3_streams(t: Timeline, *, overlap_comm: bool, ds_version: str) -> bool:
    """Put ZeRO-3's collective tensors on their streams in ``t``'s allocator simulation; True if done."""
    if t.tracker is None or not overlap_comm or ds_version != "0.19":
        return False
    t.streams.update(STREAM_OF)
    t.deferred_frees.update(DEFERRED)
    return True
