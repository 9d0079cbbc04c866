"""NVMe offload: what goes to NVMe, what stays pinned, and the verdict against the NVMe space."""

import dataclasses
from math import ceil

from memfit.core.plan import make_plan
from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.inputs import ScenarioInputs

from conftest import EXAMPLES

CFG = str(EXAMPLES / "deepspeed" / "zero3_nvme_offload.json")


def _plan(nvme="2TB"):
    sc = build_scenario(ScenarioInputs(model="gpt2-xl", gpus="1xrtx3090", deepspeed=CFG, nvme=nvme, seq_len=512))
    return sc, make_plan(sc)


def test_partitions_and_optimizer_state_on_nvme():
    sc, plan = _plan()
    W, nb = sc.world_size, 2
    big = [p for p in sc.model.params if ceil(p.numel / W) * nb >= 2**20]
    parts = sum(ceil(p.numel / W) * nb for p in big)
    n_part = sum(ceil(p.numel / W) for p in sc.model.params if p.trainable)
    states = sc.deepspeed.optimizer.states_per_param
    step = plan.phase("optimizer_step")
    frozen_parts = sum(ceil(p.numel / W) * nb for p in big if not p.trainable)
    in_cpu = min(n_part, sc.deepspeed.zero.offload_param.max_in_cpu)
    # frozen partitions >= 1 MiB, trained partitions beyond max_in_cpu, fp32 master + fp32 grads + states
    assert step.nvme_bytes == frozen_parts + (n_part - in_cpu) * nb + n_part * 4 * (2 + states)
    assert parts >= frozen_parts
    res = {i.key: i for i in step.resident}
    assert res["nvme.param_swap_buffers"].device.value == "cpu_pinned"
    assert "optimizer.fp32_master" not in res


def test_nvme_space_is_checked():
    _, plan = _plan(nvme="1GB")
    assert not plan.verdict.fits
    assert plan.verdict.failures[0].device == "nvme"
