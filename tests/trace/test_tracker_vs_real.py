"""The fake-tensor trace against reality: the same step on real CPU tensors.

Two references, both independent of the fake-tensor machinery:

1. The same ``AllocationTracker`` run on real tensors: every category at the end of the forward,
   both peaks and the saved bytes must agree byte for byte, which checks that fake tensors give the
   same storages, aliasing and lifetimes as real ones.
2. torch's own CPU allocator, read through ``torch.profiler`` (``profile_memory=True``: every
   allocation event carries ``total_allocated``): the highest live bytes of the forward and of the
   backward must equal the trace's peaks minus what was allocated before the step (parameters,
   buffers, inputs). What the dispatcher never sees may differ, and only that: gradient
   checkpointing stashes the CPU RNG state of every checkpointed layer (``torch.get_rng_state()``,
   a CPU tensor also on a GPU run), and Python scalars wrapped into tiny tensors (< 128 B).
"""

from __future__ import annotations

import pytest
from trace_models import TINY, real_model

from memfit.core.peft.spec import PeftSpec
from memfit.trace.results import TraceOptions
from memfit.trace.step import causal_lm_inputs, trace_model, trace_training_step

CASES = [
    (family, method, attention, gc)
    for family in ("gptj", "llama")
    for method in ("full", "lora", "prefix")
    for attention in ("sdpa", "eager")
    for gc in (False, True)
    if not (method == "prefix" and gc)  # transformers cannot run it (see test_trace_step.py)
]
QUICK = {("gptj", "full", "sdpa", False), ("llama", "lora", "eager", False), ("gptj", "prefix", "sdpa", False),
         ("llama", "full", "sdpa", True)}
GRID = [c if c in QUICK else pytest.param(*c, marks=pytest.mark.slow) for c in CASES]
"""Every case runs in the slow suite, four in the quick one."""
SCALAR_SLACK_BYTES = 128
"""Python scalars wrapped into CPU tensors outside the dispatcher (measured: 0 to 72 B)."""


def _options(attention: str, gc: bool) -> TraceOptions:
    return TraceOptions(seq_len=32, micro_batch=2, dtype="fp32", attention=attention, gradient_checkpointing=gc,
                        kernels="cpu", granularity_bytes=1)


def _spec(method: str) -> PeftSpec:
    # the real model (trace_models.real_model) sets encoder_hidden_size to the hidden size (64 in
    # every TINY config); peft's own default would be token_dim
    if method == "prefix":
        return PeftSpec(method=method, num_virtual_tokens=5, prefix_projection=True, encoder_hidden_size=64)
    return PeftSpec(method=method)


def _profiled_peaks(model, inputs) -> tuple[int, int]:
    """Highest CPU-allocator live bytes during forward and during backward, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = model(**inputs)
        with record_function("memfit_backward"):
            out.loss.backward()
    results = prof.profiler.kineto_results
    backward_start = next(e.start_ns() for e in results.events() if e.name() == "memfit_backward")
    allocs = []

    def walk(node):
        if type(node.extra_fields).__name__.endswith("Allocation"):
            allocs.append(node)
        for child in node.children:
            walk(child)

    for root in results.experimental_event_tree():
        walk(root)
    allocs.sort(key=lambda n: n.start_time_ns)
    base = allocs[0].extra_fields.total_allocated - allocs[0].extra_fields.alloc_size
    fwd = max(a.extra_fields.total_allocated for a in allocs if a.start_time_ns < backward_start) - base
    bwd = max(a.extra_fields.total_allocated for a in allocs if a.start_time_ns >= backward_start) - base
    return fwd, bwd


@pytest.mark.parametrize("family,method,attention,gc", GRID)
def test_fake_trace_equals_real_tensor_trace(family, method, attention, gc):
    options = _options(attention, gc)
    fake = trace_training_step(TINY[family], _spec(method), options)
    model = real_model(TINY[family], method=method, attention=attention, gradient_checkpointing=gc)
    real = trace_model(model, causal_lm_inputs(options), options, method=method)
    assert fake.end_of_forward == real.end_of_forward
    assert fake.saved_bytes == real.saved_bytes > 0
    assert fake.forward.peak_bytes == real.forward.peak_bytes
    assert fake.backward.peak_bytes == real.backward.peak_bytes
    assert fake.end_of_backward == real.end_of_backward


@pytest.mark.parametrize("family,method,attention,gc", GRID)
def test_fake_trace_matches_the_cpu_allocator(family, method, attention, gc):
    import torch

    options = _options(attention, gc)
    fake = trace_training_step(TINY[family], _spec(method), options)
    start = fake.end_of_forward
    before_step = start.param_trainable_bytes + start.param_frozen_bytes + start.buffer_bytes + start.input_bytes
    model = real_model(TINY[family], method=method, attention=attention, gradient_checkpointing=gc)
    fwd, bwd = _profiled_peaks(model, causal_lm_inputs(options))
    fake_fwd = fake.forward.peak_bytes - before_step
    fake_bwd = fake.backward.peak_bytes - before_step
    if not gc:
        assert abs(fwd - fake_fwd) <= SCALAR_SLACK_BYTES
        assert abs(bwd - fake_bwd) <= SCALAR_SLACK_BYTES
    else:
        layers = TINY[family].get("n_layer", TINY[family].get("num_hidden_layers"))
        rng = torch.get_rng_state().nbytes  # one stash per checkpointed layer, on the host
        rng_bytes = rng() if callable(rng) else rng
        assert abs(fwd - fake_fwd - layers * rng_bytes) <= SCALAR_SLACK_BYTES
        assert 0 <= bwd - fake_bwd <= layers * rng_bytes + SCALAR_SLACK_BYTES
