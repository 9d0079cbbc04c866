"""The test selections mutations run: each a comparison with something real (see ``mutation.py``)."""

# Test selections (paths relative to the repository root, optional "-k" expressions).
PLAN_VS_REPLAY = ("tests/replay/test_plan_vs_replay.py",)
"""Every replay fixture (real DeepSpeed 0.19.8 runs) against the re-planned ledger: items and their
pinned bytes to the byte, pinned/pageable per phase, phase peaks (fast: JSON only)."""
REPLAY_STEP = ("tests/replay/test_activations_vs_replay.py",)
"""The replays' forward/backward against CPU-kernel traces of the same step (a few seconds)."""
SUB_GROUPS = ("tests/replay/test_sub_groups_vs_deepspeed.py",)
ANALYTIC_VS_TRACE = ("tests/trace/test_activations_vs_trace.py", "tests/trace/test_seed_trace_fixture.py")
"""The analytic activation model against fake-tensor traces of the real model code (0.5%)."""
PEFT_LIBRARY = ("tests/exact/test_peft_against_library.py",)
"""memfit's PEFT accounting against the models peft and transformers really build."""
DS_CONFIG = ("tests/exact/test_dsconfig_against_deepspeed.py",)
"""Config reading against DeepSpeed's own config classes and transformers' Trainer "auto" filling."""
ALLOC_RULES = ("tests/core/test_alloc_vs_torch_tests.py", "tests/core/test_alloc_cuda.py",
               "tests/core/test_alloc_recording.py")
"""The CUDA caching allocator simulator against the sequences torch's test_cuda.py checks on GPUs,
published programs with their GPU readings, and cases derived from CUDACachingAllocator.cpp."""
ALLOC_SEED = ("tests/core/test_alloc_seed.py",)
"""The seed plan's allocator figures re-derived independently from the ledger's tensors and torch's rules."""
PINNED_RULES = ("tests/core/test_alloc_vs_torch_tests.py", "tests/core/test_alloc_pinned.py")
"""The pinned host allocator against test_cuda.py's GPU-checked pinned tests, the published
measurements pytorch#95823 and vllm-backport#67, and cases derived from CachingHostAllocator.h."""
NON_PYTORCH = ("tests/core/test_alloc_vs_torch_tests.py",)
"""GPU memory outside the caching allocator against published programs' readings and test_cuda.py's
cuBLAS workspace check."""
NON_PYTORCH_MODEL = ("tests/core/test_alloc_timeline.py",)
"""The model of memory outside PyTorch per stack (context, NCCL per world size and interconnect)."""
SEQUENCE = ("tests/core/test_alloc_sequence.py", "tests/core/test_activation_tensors.py")
"""Alloc/free sequences: tensor by tensor activations, ZeRO-3's side streams, deferred frees."""
SEQUENCE_REPLAY = ("tests/replay/test_sequence_vs_replay.py",)
"""The alloc/free sequences recorded by torch.profiler in real CPU runs of DeepSpeed and torch/DDP/FSDP
(tests/fixtures/replay_sequence): the recording's simulated peaks against the host tracker's own figures,
and the ledger's sequence through the allocator simulation against the recording's."""
TORCH_FIXTURES = ("tests/replay/test_torch_plan_vs_replay.py",)
"""Every torch/DDP/FSDP replay fixture (real runs on this CPU) against the re-planned ledger: sizes
read off the objects to the byte, phase peaks (fast: JSON only)."""
DDP_TORCH = ("tests/replay/test_ddp_vs_torch.py", "-m", "not slow") + TORCH_FIXTURES
"""DDP's bucket assignment against torch's own function and the buckets of DDP's real reducer."""
FSDP_TRACKER = ("tests/trace/test_fsdp_vs_memtracker.py",) + TORCH_FIXTURES
"""FSDP2 against torch's FSDPMemTracker (fake world) and the FSDP replay fixtures."""
FSDP1_FLAT = ("tests/replay/test_fsdp1_vs_torch.py",) + TORCH_FIXTURES
"""FSDP1's flat parameters against real FullyShardedDataParallel's (fake world, W = 3 and 4)."""
BNB = ("tests/exact/test_quant_against_bnb.py",) + TORCH_FIXTURES
"""Quantized storage against bitsandbytes' real Params4bit/Int8Params on this CPU."""
OPTIM = ("tests/replay/test_optimizers_vs_torch.py", "tests/exact/test_optimizer_states_against_libraries.py") + TORCH_FIXTURES
"""Optimizer states and step temporaries against the real optimizers' state dicts and allocations, and each
state tensor against the one the library creates (per shape class)."""
AMP = ("tests/trace/test_amp_casts_vs_autocast.py",) + TORCH_FIXTURES
"""Autocast's weight copies against torch.autocast on this CPU (made, alive, kept for backward)."""
PUBLIC_RUNS = ("tests/core/test_public_runs.py",)
"""Published measured GPU runs (tests/fixtures/public_runs): no figure's error against its measurement may
grow, no verdict that agreed with the run's outcome may disagree."""
TRACKER = ("tests/core/test_alloc_tracker_vs_published.py",)
"""The ledger's path into the simulators (MemoryTracker's per-phase figures) against published readings:
pytorch#86509's cudaMemGetInfo (and nvidia-smi), pytorch#95823's locked pinned memory."""
PEFT_TUNERS = ("tests/exact/test_every_tuner.py",)
"""Every peft tuner's adapter_config.json (saved by peft) planned by memfit and built by get_peft_model: the
same parameters and adapter buffers, name by name."""
