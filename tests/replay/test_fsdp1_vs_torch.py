"""FSDP1's flat parameters in the core (``memfit.core.ledger.pytorch.fsdp_units.build_units``) against the
``FlatParameter`` objects real ``FullyShardedDataParallel`` builds, in a fake world on this CPU.

The replay fixtures run FSDP1 with W = 2 on a model whose sizes are all multiples of 4 elements, where
neither the padding of a flat parameter to a multiple of W nor ``use_orig_params``' 16-byte
alignment of each param shows. Here a tiny Llama 126 wide (norm weights of 126 elements: not 16-byte
aligned in fp32) is wrapped per decoder block (as accelerate's transformer policy does,
``memfit.replay.pytorch.fsdp.wrap_fsdp``) for W = 3 and 4, with and without ``use_orig_params``. Per
FSDP unit, to the element: the padded flat size (S x the local shard) and the local shard.
"""

from __future__ import annotations

import json
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

CASES = [(3, True), (4, True), (4, False)]


def _memfit(cfg, W, use_orig, tmp_path):
    from memfit.core.ledger.pytorch.fsdp_units import build_units
    from memfit.core.ledger.pytorch.params import build_torch_model
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.inputs import ScenarioInputs

    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    sc = build_scenario(ScenarioInputs(model=str(path), framework="fsdp", precision="fp32", optim="adamw_torch",
                                       fsdp={"use_orig_params": use_orig}, gpus=f"{W}x24GiB", accelerator="cpu",
                                       seq_len=16, micro_batch=1))
    units = build_units(sc, build_torch_model(sc))
    root = [u for u in units if u.name == "root"]
    return [[(pc.numel, pc.shard_numel) for pc in u.pieces] for u in root + [u for u in units if u.name != "root"]]


def _torch(cfg, W, use_orig):
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from memfit.replay.model_build import build_model
    from memfit.replay.pytorch.fsdp import wrap_fsdp

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=W)
    try:
        torch.manual_seed(0)
        model = build_model(cfg, dtype="fp32")
        spec = types.SimpleNamespace(fsdp={"use_orig_params": use_orig}, framework="fsdp", accelerator="cpu",
                                     world_size=W)
        wrapped = wrap_fsdp(model, spec, [])
        out = []
        for m in wrapped.modules():  # the root first, then the blocks in order
            if isinstance(m, FSDP) and m._handle is not None:
                shard = m._handle.flat_param.numel()  # rank 0's local shard, padding included
                out.append([(shard * W, shard)])
        return out
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("W,use_orig", CASES, ids=[f"W{w}-use_orig_params={u}" for w, u in CASES])
def test_flat_parameters_match_fsdp1(W, use_orig, tmp_path):
    from memfit.replay.deepspeed.record_fixtures import TINY_LLAMA

    cfg = dict(TINY_LLAMA, num_hidden_layers=2, hidden_size=126, num_attention_heads=3, num_key_value_heads=1,
               intermediate_size=170, vocab_size=1001)
    mine, real = _memfit(cfg, W, use_orig, tmp_path), _torch(cfg, W, use_orig)
    print(f"W={W} use_orig_params={use_orig}: memfit {mine}, torch {real}")
    assert mine == real
