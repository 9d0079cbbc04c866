"""ZeRO-3 in-step memory replayed over a traced step: DeepSpeed's fetch/release rules at their limits.

Each case sets the DeepSpeed knobs so that the rule under test alone decides the answer, and checks
it against numbers read from the traced model (parameter sizes per module), not against numbers
this code produced.
"""

from __future__ import annotations

import math

import pytest
from trace_models import TINY

from memfit.core.frameworks.deepspeed import DeepSpeedSettings, OffloadSettings, ZeroSettings
from memfit.core.ledger_types import Device
from memfit.core.peft.spec import PeftSpec
from memfit.errors import MemfitError
from memfit.trace.results import TraceOptions
from memfit.trace.deepspeed.zero3_step import zero3_step_memory


@pytest.fixture(scope="module")
def llama_trace():
    from memfit.trace.step import trace_training_step

    return trace_training_step(TINY["llama"], PeftSpec(), TraceOptions(seq_len=32, micro_batch=2, zero3_linear=True))


@pytest.fixture(scope="module")
def prefix_trace():
    from memfit.trace.step import trace_training_step

    # a wide encoder, as in the seed case: its output Linear's gradient dominates the step
    spec = PeftSpec(method="prefix", num_virtual_tokens=4, prefix_projection=True, encoder_hidden_size=8192)
    return trace_training_step(TINY["gptj"], spec, TraceOptions(seq_len=32, zero3_linear=True))


def _ds(**zero) -> DeepSpeedSettings:
    return DeepSpeedSettings(precision="fp16", zero=ZeroSettings(stage=3, **zero))


def _item(result, key: str) -> int:
    return next(i.bytes for i in result.items if i.key == key)


def _module_bytes(trace) -> list[int]:
    return [sum(trace.params[p].numel * trace.params[p].element_bytes for p in m.params) for m in trace.modules]


def test_without_prefetch_or_reuse_only_the_running_module_is_gathered(llama_trace):
    """prefetch 0, reuse distance 0, no persistence: at most one module's params are whole at a
    time, plus its coalesced all-gather buffer (one flat copy) while the copies are made."""
    res = zero3_step_memory(llama_trace, _ds(prefetch_bucket_size=0, max_reuse_distance=0,
                                             param_persistence_threshold=0), world_size=2)
    largest = max(_module_bytes(llama_trace))
    assert 0 < res.max_gathered_bytes <= 2 * largest  # the module plus its one coalesced all-gather copy
    assert res.first_step_peak_bytes <= res.peak_bytes


def test_one_rank_gathers_nothing(llama_trace):
    """W = 1: partition_parameters.py all_gather_coalesced -> _no_gather_coalesced, ``param.data =
    ds_tensor.to(device)``: the partition is the whole param, on the GPU already (no offload)."""
    res = zero3_step_memory(llama_trace, _ds(param_persistence_threshold=0), world_size=1)
    assert res.max_gathered_bytes == 0


def test_persistent_params_are_never_gathered(llama_trace):
    largest_param = max(p.numel for p in llama_trace.params)
    res = zero3_step_memory(llama_trace, _ds(param_persistence_threshold=largest_param), world_size=2)
    assert res.max_gathered_bytes == 0


def test_more_prefetch_and_live_params_never_lower_the_peak(llama_trace):
    total = sum(p.numel for p in llama_trace.params)
    small = zero3_step_memory(llama_trace, _ds(prefetch_bucket_size=1, max_live_parameters=1,
                                               param_persistence_threshold=0), world_size=2)
    large = zero3_step_memory(llama_trace, _ds(prefetch_bucket_size=total, max_live_parameters=total,
                                               param_persistence_threshold=0), world_size=2)
    assert large.max_gathered_bytes > small.max_gathered_bytes
    assert large.peak_bytes >= small.peak_bytes


def test_huge_reuse_distance_keeps_everything_gathered_at_the_turn(llama_trace):
    """With max_reuse_distance above the model size every param is reused "soon": none is released
    in the forward, so all non-persistent params are whole when the backward starts."""
    total = sum(p.numel * p.element_bytes for p in llama_trace.params)
    res = zero3_step_memory(llama_trace, _ds(prefetch_bucket_size=0, max_reuse_distance=10**12,
                                             param_persistence_threshold=0), world_size=2)
    assert res.max_gathered_bytes >= total


def test_a_gradient_larger_than_the_bucket_is_held_whole(prefix_trace):
    """The prefix encoder's output Linear has more elements than a tiny reduce bucket: its gradient
    is kept as a full tensor until the next reduce (stage3.py __add_grad_to_ipg_bucket)."""
    biggest = max((p for p in prefix_trace.params if p.trainable), key=lambda p: p.numel)
    res = zero3_step_memory(prefix_trace, _ds(reduce_bucket_size=biggest.numel // 2,
                                              offload_optimizer=OffloadSettings(device="cpu")), world_size=2)
    assert res.max_gradient_bytes >= biggest.numel * biggest.element_bytes
    assert res.phase == "backward" and res.module.startswith("prompt_encoder")
    assert _item(res, "step.full_gradient") >= biggest.numel * biggest.element_bytes
    items = {i.key: i for i in res.items}
    assert sum(i.bytes for i in res.items) == res.peak_bytes
    assert all(i.device == Device.GPU for i in res.items)
    assert items["step.activations"].exact and not items["zero3.gathered_params"].exact


def test_world_size_shrinks_nothing_gathered_but_the_padding(llama_trace):
    """Gathered params are whole on every rank: the world size only changes the padding of each
    param to a multiple of W (ceil(p/W) x W). (W = 1 gathers nothing at all: see above.)"""
    two = zero3_step_memory(llama_trace, _ds(param_persistence_threshold=0), world_size=2)
    many = zero3_step_memory(llama_trace, _ds(param_persistence_threshold=0), world_size=7)
    padding = sum((math.ceil(p.numel / 7) * 7 - p.numel) * p.element_bytes for p in llama_trace.params)
    assert two.peak_bytes <= many.peak_bytes <= two.peak_bytes + 2 * padding + 7 * 2 * 64


def test_stage_and_world_size_are_checked(llama_trace):
    with pytest.raises(MemfitError):
        zero3_step_memory(llama_trace, DeepSpeedSettings(zero=ZeroSettings(stage=2)), world_size=2)
    with pytest.raises(MemfitError):
        zero3_step_memory(llama_trace, _ds(), world_size=0)


@pytest.fixture(scope="module")
def lora_trace():
    from memfit.trace.step import trace_training_step

    cfg = dict(TINY["llama"], num_hidden_layers=6)  # 6 blocks: gathers open and close many times
    spec = PeftSpec(method="lora", lora_r=4, target_modules=("q_proj", "v_proj"))
    return trace_training_step(cfg, spec, TraceOptions(seq_len=32, zero3_linear=True))


@pytest.mark.parametrize("prefetch,max_live,reuse", [(3_000, 60_000, 6_000), (5_000, 100_000, 10_000)])
def test_every_all_gather_buffer_is_freed_within_the_step(lora_trace, prefetch, max_live, reuse):
    """LoRA under ZeRO-3: many small coalesced gathers open and close. Each flat buffer dies when
    its last param has been fetched (``__inflight_param_registry.pop``), so none outlives the step.
    An earlier replay numbered the buffers by their count: a new one could take a live one's number
    and the old one was never freed (411,648 B left here with the first limits; a 70B LoRA model
    showed >100 GiB "in flight")."""
    from memfit.trace.deepspeed.zero3_step import _Replay

    ds = _ds(prefetch_bucket_size=prefetch, max_live_parameters=max_live, max_reuse_distance=reuse,
             param_persistence_threshold=0)
    replay = _Replay(lora_trace, ds, 8, complete_trace=True)
    replay.run()
    assert replay.inflight == 0


def test_gathered_params_stay_under_the_rules_bound(lora_trace):
    """The gathered params and flat buffers the trace replay finds stay under
    ``zero3_fetch.upper_bound_numel`` (the bound the ledger prints)."""
    from memfit.core.ledger.deepspeed.zero3_fetch import upper_bound_numel

    W, prefetch, max_live, reuse = 8, 3_000, 60_000, 6_000
    ds = _ds(prefetch_bucket_size=prefetch, max_live_parameters=max_live, max_reuse_distance=reuse,
             param_persistence_threshold=0)
    res = zero3_step_memory(lora_trace, ds, world_size=W)
    aligned = [math.ceil(p.numel / W) * W for p in lora_trace.params]
    modules = [sum(aligned[p] for p in m.params) for m in lora_trace.modules]
    chain = max(sum(modules[j] for j, o in enumerate(lora_trace.modules)
                    if o.name == "" or m.name == o.name or m.name.startswith(o.name + "."))
                for m in lora_trace.modules)
    bound = upper_bound_numel(chain_numel=chain, largest_module=max(modules), largest_param=max(aligned),
                              total_numel=sum(aligned), prefetch_bucket_size=prefetch,
                              max_live_parameters=max_live, max_reuse_distance=reuse)
    assert 0 < res.max_gathered_bytes <= bound * lora_trace.params[0].element_bytes
