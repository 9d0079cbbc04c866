"""``step_segments.gather_passes_offloaded_and_not`` (one coordinator run giving the ZeRO-3 gather pass
with the partitions offloaded and without) against ``gather_pass`` run twice, once per offload
setting, field by field, over RECORD and complete passes, checkpointing, prefetch and max-live
limits, persistence thresholds, mixed element sizes, sequential all-gathers and world sizes."""

import dataclasses

import pytest
from conftest import SEED

from memfit.core.ledger.deepspeed.step_segments import gather_pass, gather_passes_offloaded_and_not
from memfit.core.ledger.deepspeed.zero3_fetch import GParam
from memfit.core.recommend.deepspeed.aggregates import ScenarioAggregates
from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.inputs import ScenarioInputs
from memfit.core.scenario.read import read_scenario_file

Z3 = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
CASES = {
    "seed-kogpt-prefix-2gpus": lambda: read_scenario_file(SEED),
    "opt-prefix-3gpus": lambda: ScenarioInputs(model="facebook/opt-1.3b", peft_method="prefix", gpus="3xrtx3090", load_dtype="fp32",
                                               seq_len=256, deepspeed_inline=Z3),
    "gpt2-lora-8gpus": lambda: ScenarioInputs(model="gpt2", peft_method="lora", gpus="8xa100-80gb", seq_len=256,
                                              deepspeed_inline=Z3),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_run_gives_both_offload_settings(name):
    agg = ScenarioAggregates.from_scenario(build_scenario(CASES[name]()))
    sc = agg.scenario
    z = sc.deepspeed.zero
    checked = 0
    for eb in (agg.element_bytes("fp16", "fp16", False), agg.element_bytes("fp16", "fp32", True)):
        for threshold in (0, 100_000):
            flags, _ = agg._persistent(threshold, sc.ds_version)
            params = [GParam(n, e, f) for n, e, f in zip(agg.numels, eb, flags)]
            for ckpt in (False, True):
                layout = agg.layout(ckpt)
                for complete, available, prefetch, live, sequential in (
                        (False, False, 0, 0, False), (True, True, 50_000_000, 1_000_000_000, False),
                        (True, False, 10_000_000, 20_000_000, False), (True, True, 50_000_000, 1_000_000_000, True)):
                    kw = dict(prefetch_bucket_size=prefetch, max_live_parameters=live,
                              max_reuse_distance=z.max_reuse_distance, allgather_sequential=sequential,
                              complete=complete, persistent_available=available)
                    pair = gather_passes_offloaded_and_not(layout, params, agg.world, **kw)
                    alone = tuple(gather_pass(layout, params, agg.world, offload_param=off, **kw)
                                  for off in (True, False))
                    for got, want in zip(pair, alone):
                        for f in dataclasses.fields(want):
                            assert getattr(got, f.name) == getattr(want, f.name), (name, f.name, kw, ckpt)
                    checked += 1
    # the two passes differ wherever a partition is copied to the GPU: the check sees both
    assert checked == 32
    assert pair[0].forward != pair[1].forward


def test_one_rank_is_refused():
    agg = ScenarioAggregates.from_scenario(build_scenario(
        ScenarioInputs(model="gpt2", peft_method="lora", gpus="1xa100-80gb", seq_len=256,
                       deepspeed_inline=Z3)))
    params = [GParam(n, 2, False) for n in agg.numels]
    with pytest.raises(ValueError, match="one rank"):
        gather_passes_offloaded_and_not(agg.layout(False), params, 1, prefetch_bucket_size=0, max_live_parameters=0,
                                        max_reuse_distance=0, allgather_sequential=False, complete=False,
                                        persistent_available=False)
