"""The one-process world: DeepSpeed's collectives fill their outputs as if every rank held this
rank's data, with torch's own fake group and with memfit's mirror (run in subprocesses: they
create the default process group)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import sys
import torch
import memfit.replay.fake_world as fake_world
if sys.argv[1] == "mirror":  # as on a torch whose fake group leaves outputs untouched
    from deepspeed.comm.torch import TorchBackend
    for name in fake_world._MIRRORS:
        setattr(TorchBackend, name, lambda self, *args, **kwargs: None)
    fake_world.fake_group_fills_outputs = lambda world_size: False
fake_world.join_fake_world(rank=1, world_size=4)
import deepspeed.comm as dist
assert getattr(dist.comm.cdb, "_memfit_mirrored", False) == (sys.argv[1] == "mirror")

assert dist.get_world_size() == 4 and dist.get_rank() == 1
inp = torch.arange(3, dtype=torch.float32) + 1
out = torch.full((12,), float("nan"))
dist.all_gather_into_tensor(out, inp)
assert out.tolist() == [1.0, 2.0, 3.0] * 4, out

grads = torch.arange(8, dtype=torch.bfloat16)
part = torch.full((2,), float("nan"), dtype=torch.bfloat16)
dist.reduce_scatter_tensor(part, grads)
assert part.tolist() == [2.0, 3.0], part  # rank 1's slice

outs = [torch.full((2,), float("nan")) for _ in range(4)]
dist.all_gather(outs, torch.tensor([5.0, 6.0]))
assert all(o.tolist() == [5.0, 6.0] for o in outs), outs

# In place, as ZeRO-3 does it: the input is this rank's slice of the output.
flat = torch.zeros(8)
flat[2:4] = torch.tensor([7.0, 8.0])
dist.all_gather_into_tensor(flat, flat.narrow(0, 2, 2))
assert flat.tolist() == [7.0, 8.0] * 4, flat
print("ok")
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["torch", "mirror"])
def test_collectives_fill_outputs_like_identical_ranks(mode):
    pytest.importorskip("deepspeed")
    env = dict(os.environ, DS_ACCELERATOR="cpu", LOCAL_RANK="0", RANK="1", WORLD_SIZE="4")
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], env=env, capture_output=True, text=True, check=False,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
