"""FSDP2 in the core (``memfit.core.ledger.pytorch.fsdp``) against torch's own ``FSDPMemTracker``
(``torch/distributed/_tools/fsdp2_mem_tracker.py``) under ``FakeTensorMode`` with a fake process
group of W ranks, as torchtitan estimates memory: a tiny Llama built on the meta device, sharded as
accelerate shards it (``memfit.replay.pytorch.fsdp.apply_fully_shard``), one training step.

Compared, byte for byte: the sharded params, the sharded gradients after backward, the optimizer
state after the step, and the most unsharded-param bytes the tracker saw at any module boundary
and all-gather bytes (per-param unsharded outputs plus flat all-gather buffers) the tracker saw at any
module boundary against the most the ledger holds at any instant (the tracker snapshots at module
boundaries, the ledger at every allocation: the ledger's figure may only be larger).
FSDPMemTracker does not model what memfit adds on top (frozen PEFT params, CPU offload, host memory):
those are covered by the CPU replays in tests/replay/test_torch_plan_vs_replay.py.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

CASES = [(2, {}), (4, {}), (4, {"mixed_precision": "bf16"}), (3, {"sharding_strategy": "SHARD_GRAD_OP"})]


def _ledger(tmp_path, W, fsdp):
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.inputs import ScenarioInputs
    from memfit.core.ledger.timeline import Timeline
    from memfit.core.ledger.pytorch.build import build_torch_ledger
    from memfit.replay.deepspeed.record_fixtures import TINY_LLAMA

    cfg = dict(TINY_LLAMA, num_hidden_layers=2)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    sc = build_scenario(ScenarioInputs(model=str(path), framework="fsdp2", precision="fp32", optim="adamw_torch",
                                       fsdp=fsdp, gpus=f"{W}x24GiB", accelerator="cpu", seq_len=64, micro_batch=2))
    import dataclasses

    sc = dataclasses.replace(sc, load=dataclasses.replace(sc.load, from_checkpoint=False))
    most = {"unsharded": 0}
    orig_alloc = Timeline.alloc

    def spy(self, key, n):
        orig_alloc(self, key, n)
        if key in ("fsdp.unsharded_params", "fsdp.all_gather_buffers"):
            most["unsharded"] = max(most["unsharded"], self.live_bytes("fsdp.unsharded_params")
                                    + self.live_bytes("fsdp.all_gather_buffers"))

    Timeline.alloc = spy
    try:
        phases = build_torch_ledger(sc)
    finally:
        Timeline.alloc = orig_alloc
    res = {p.name: {i.key: i.bytes for i in p.resident} for p in phases}
    return cfg, res, most["unsharded"]


def _tracker(cfg, W, fsdp):
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPRefType
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from memfit.replay.pytorch.fsdp import apply_fully_shard
    from memfit.trace.model_build import build_meta_model

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=W, store=FakeStore())
    try:
        model = build_meta_model(cfg, attention="sdpa")
        mp = {"bf16": torch.bfloat16}.get(fsdp.get("mixed_precision"))
        apply_fully_shard(model, {"mesh": init_device_mesh("cpu", (W,)),
                                  "mp_policy": MixedPrecisionPolicy(param_dtype=mp, reduce_dtype=mp),
                                  "reshard_after_forward": fsdp.get("sharding_strategy") != "SHARD_GRAD_OP"})
        with FakeTensorMode(allow_non_fake_inputs=True):
            model.to_empty(device="cpu")
            opt = torch.optim.AdamW(model.parameters(), foreach=False)
            inp = torch.randint(0, 1000, (2, 64))
            mt = FSDPMemTracker(model, opt)
            mt.track_inputs((inp,))
            with mt:
                setup = mt.get_tracker_snapshot("current")
                model(input_ids=inp, labels=inp).loss.backward()
                bwd = mt.get_tracker_snapshot("current")
                opt.step()
                step = mt.get_tracker_snapshot("current")
            most = 0
            for stats in mt.memory_tracking.values():
                for snaps in stats.snapshots.values():
                    for snap in snaps:
                        for dev in snap.values():
                            most = max(most, dev.get(_FSDPRefType.UNSHARDED_PARAM, 0)
                                       + dev.get(_FSDPRefType.ALL_GATHER, 0))

        def get(s, k):
            return sum(d.get(getattr(_FSDPRefType, k), 0) for d in s.values())

        return get(setup, "SHARDED_PARAM"), get(bwd, "SHARDED_GRAD"), get(step, "OPT"), most
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("W,fsdp", CASES, ids=[f"W{w}-{'-'.join(f'{k}={v}' for k, v in f.items())}" for w, f in CASES])
def test_fsdp2_model_states_match_fsdp_mem_tracker(tmp_path, W, fsdp):
    cfg, res, led_unsharded = _ledger(tmp_path, W, fsdp)
    params, grads, opt, unsharded = _tracker(cfg, W, fsdp)
    print(f"W={W} {fsdp}: sharded params {params:,} grads {grads:,} opt {opt:,} unsharded max {unsharded:,} "
          f"(ledger {res['setup']['fsdp.sharded_params']:,} {res['backward']['fsdp.sharded_grads']:,} "
          f"{res['optimizer_step']['optimizer.states'] + res['optimizer_step'].get('optimizer.step_counters', 0):,} "
          f"{led_unsharded:,})")
    assert res["setup"]["fsdp.sharded_params"] == params
    assert res["backward"]["fsdp.sharded_grads"] == grads
    assert res["optimizer_step"]["optimizer.states"] + res["optimizer_step"].get("optimizer.step_counters", 0) == opt
    assert led_unsharded >= unsharded
    assert led_unsharded - unsharded <= max(res["setup"]["fsdp.sharded_params"] // 4, 0) or led_unsharded == unsharded
