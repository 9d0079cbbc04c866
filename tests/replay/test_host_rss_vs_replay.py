"""The plan's host memory per process against the resident set of real runs (CPU replays, VmRSS from
/proc: ``memfit.replay.phases.RssMonitor``), phase by phase: a plain torch run and an FSDP2 run
(kogpt's shapes at one block, 3.1 GB in fp32, LoRA: tests/fixtures/replay_torch/gptj1_*_host.json)
and a DeepSpeed ZeRO-3 offload run (the seed scenario at one block,
tests/fixtures/replay_seed/kogpt_prefix_zero3_offload_1layer_w2.json).

The plan's figure here is ``cpu_peak_bytes`` (tensors plus the ``host.*`` parts of
``memfit.core.ledger.host_process``) less two things the replays do not have or do not touch:

- ``host.tokenizer``: a replay builds no tokenizer;
- DeepSpeed's IPG reduce bucket on the CPU accelerator: ``torch.empty(reduce_bucket_size)``, never
  written until backward copies gradients into it, so its pages are not resident (Linux maps
  anonymous memory on first touch); from backward on, the part the trained params' gradients wrote is.

Tolerances are next to each constant, with the observed worst.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memfit.core.plan import make_plan
from memfit.replay.measurement import load_fixture

FIX = Path(__file__).resolve().parents[1] / "fixtures"
TORCH = FIX / "replay_torch" / "gptj1_lora_fp32_adamw_host.json"
FSDP2 = FIX / "replay_torch" / "gptj1_fsdp2_w2_lora_host.json"
SEED = FIX / "replay_seed" / "kogpt_prefix_zero3_offload_1layer_w2.json"

TOL_TORCH_PHASE = 0.03
"""Plain torch run, every phase: the plan is below RSS by what the process grows during the first
steps on the CPU (oneDNN/OpenMP scratch, autograd's structures: 15-71 MiB). Observed worst -2.2%
(step2.optimizer_step, of 3,292 MiB)."""
TOL_DS_PHASE = 0.045
"""DeepSpeed ZeRO-3 offload, every phase: observed worst -3.4% (optimizer_step, 61 MiB of 1,798 MiB:
the same CPU-step growth, against a smaller resident set); load to initialize.partition within 1.1%."""
TOL_RUN_PEAK = 0.025
"""The run's host peak (the largest phase), each run: observed -0.5% (DeepSpeed, initialize.cast),
-1.9% (torch), -1.3% (FSDP2, save)."""
TOL_FSDP2_OTHER_PHASES = 0.05
"""FSDP2 outside forward and backward: observed worst -3.8% (step2.optimizer_step)."""


def _plan_and_measurement(path: Path):
    m = load_fixture(str(path))
    if m.spec.framework in (None, "deepspeed"):
        from memfit.replay.deepspeed.compare import deepspeed_scenario_of as scenario_of
    else:
        from memfit.replay.pytorch.compare import torch_scenario_of as scenario_of
    sc = scenario_of(m)
    return sc, make_plan(sc), m


def _resident(sc, plan, m) -> dict[str, tuple[int, int]]:
    """phase -> (plan's resident host bytes per process, the replay's RSS peak)."""
    trained_grads = sc.model.trainable_params * 2  # what backward writes into the bucket (16-bit grads)
    out, wrote = {}, False
    for mp in m.phases:
        if mp.rss_peak_bytes is None:
            continue
        ph = plan.phase(mp.name)
        tok = sum(i.bytes for i in ph.items if i.key == "host.tokenizer")
        bucket = sum(i.bytes for i in ph.items if i.key == "zero3.ipg_bucket") if sc.accelerator == "cpu" else 0
        untouched = max(bucket - trained_grads, 0) if wrote else bucket
        if mp.name.endswith("backward"):
            wrote = True
        out[mp.name] = (ph.cpu_peak_bytes - tok - untouched, mp.rss_peak_bytes)
    return out


@pytest.mark.parametrize("path,tol", [(TORCH, TOL_TORCH_PHASE), (SEED, TOL_DS_PHASE)], ids=["torch", "zero3-offload"])
def test_every_phase_matches_the_resident_set(path, tol):
    sc, plan, m = _plan_and_measurement(path)
    rows = _resident(sc, plan, m)
    assert len(rows) >= 8
    for name, (mine, rss) in rows.items():
        print(f"{path.stem} {name}: plan {mine / 2**20:,.1f} MiB, RSS {rss / 2**20:,.1f} MiB ({mine / rss - 1:+.1%})")
        assert abs(mine - rss) <= tol * rss, name


@pytest.mark.parametrize("path", [TORCH, FSDP2, SEED], ids=["torch", "fsdp2", "zero3-offload"])
def test_the_runs_host_peak_matches(path):
    sc, plan, m = _plan_and_measurement(path)
    rows = _resident(sc, plan, m)
    mine, rss = max(v[0] for v in rows.values()), max(v[1] for v in rows.values())
    assert abs(mine - rss) <= TOL_RUN_PEAK * rss, (mine, rss)


def test_fsdp2_outside_the_step_matches_the_resident_set():
    sc, plan, m = _plan_and_measurement(FSDP2)
    for name, (mine, rss) in _resident(sc, plan, m).items():
        if not name.endswith(("forward", "backward")):
            assert abs(mine - rss) <= TOL_FSDP2_OTHER_PHASES * rss, name


@pytest.mark.xfail(strict=True, reason="known gap, found by this replay: at the tail unit's copy-out the FSDP2 "
                   "replay still holds the previous unit's all-gather output (770 MiB; memfit frees it first, as "
                   "_fsdp_param_group.py:wait_for_unshard reads): forward is 17% under the resident set, backward "
                   "5% over")
def test_fsdp2_forward_matches_the_resident_set():
    sc, plan, m = _plan_and_measurement(FSDP2)
    for name, (mine, rss) in _resident(sc, plan, m).items():
        if name.endswith(("forward", "backward")):
            assert abs(mine - rss) <= TOL_FSDP2_OTHER_PHASES * rss, name
