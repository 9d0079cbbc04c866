"""PyTorch's memory allocators, simulated in pure Python (no torch import).

- ``versions``: the torch versions memfit knows and which allocator rules each one has;
- ``conf``: a strict parser of ``PYTORCH_CUDA_ALLOC_CONF`` / ``PYTORCH_ALLOC_CONF`` for a version;
- ``cuda_caching``: the public names of the CUDA caching allocator and ``check_against_recording``
  (a ``torch.cuda.memory._snapshot()`` trace replayed through it), gathered from
  ``device_caching`` (the simulator, ``c10/cuda/CUDACachingAllocator.cpp``) and ``recording``;
- ``pinned_host``: the pinned host allocator (``ATen/core/CachingHostAllocator.h``, torch 1.10's
  ``THCCachingHostAllocator.cpp``, DeepSpeed's ``DS_PIN_MEMORY_BACKEND=native``);
- ``non_pytorch``: GPU memory outside the caching allocator (CUDA context, NCCL, cuBLAS);
- ``tracker``: the ledger's alloc/free calls replayed through the simulators, per phase.
- ``ops``: a run of alloc/free ops through the CUDA caching allocator in one loop (the epoch simulation's).
"""
