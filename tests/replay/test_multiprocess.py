"""The fake world is a faithful stand-in for a real one.

The seed-like case (tiny GPT-J, prefix tuning, ZeRO-3 with param and optimizer offload, W=2) runs
twice on DeepSpeed's CPU accelerator: in the one-process fake world (``launcher="fake"``) and as two
real processes started by torchrun on a gloo process group (``launcher="torchrun"``). Both use one
thread per process (two cores, two ranks).

What must agree, and why:

- every size read off DeepSpeed's objects (``Measurement.items`` at load, after initialize, after
  the first step), on every real rank: DeepSpeed sizes its buffers from the world size, never from
  the data the collectives move;
- host live and pinned bytes at every phase boundary, byte for byte (rank 0; rank 1 too, except in
  save, where only rank 0 builds the consolidated 16-bit state dict): the same tensors are
  allocated and freed;
- host peaks: exactly up to partitioning; after it, up to gloo's staging buffers.

What differs, and why (measured with the profiler's allocation events, by thread and parent op):

- every gloo all-gather allocates two buffers of its output's size for the duration of the call:
  one on the calling thread under ``c10d::_allgather_base_`` and one on gloo's worker thread under
  ``gloo:all_gather`` (NCCL on CUDA writes into the output and keeps its buffers outside PyTorch's
  allocator). When that coincides with a phase's peak, the real peak is higher: by 65 536 B in
  initialize.optimizer, 256 000 B (one buffer of the gathered 16-bit word embedding) or 518 144 B
  (two buffers) in the second forward depending on thread timing, 256 000 B in save, 2-3 KB in the
  optimizer steps. The largest all-gather here outputs 337 920 B, so two of its buffers bound it.
- losses: the fake all-gather fills every rank's slice with this rank's slice, so its model is not
  the real one; the real ranks gather the true weights and compute identical losses.

The real world needs ``fake_world.hold_finished_work``: without it gloo's worker threads free some
buffers where the profiler does not look, and the real run's live bytes drift up by hundreds of KB.
"""

from __future__ import annotations

import dataclasses

import pytest

from memfit.errors import MemfitError
from memfit.replay.child import rank_output_path
from memfit.replay.deepspeed.record_fixtures import CASES
from memfit.replay.runner import child_argv, run_replay, run_replay_ranks

TIMEOUT_S = 300
CASE = "gptj_prefix_z3_offload_w2"
EXACT_PHASES = ("load", "initialize.cast", "initialize.move", "initialize.partition")
"""Phases whose host peak no gloo all-gather reaches."""
GLOO_STAGING_BYTES = 2 * 337_920
"""Tolerance on every other phase's host peak: the two buffers gloo allocates during the largest
all-gather of this case (its output, 337 920 B, as the profiler reports under gloo:all_gather)."""


@pytest.fixture(scope="module")
def worlds(cpu_adam_built):
    spec = dataclasses.replace(CASES[CASE], threads=1)
    fake = run_replay(spec, timeout_s=TIMEOUT_S)
    real = run_replay_ranks(dataclasses.replace(spec, launcher="torchrun"), timeout_s=TIMEOUT_S)
    for m in (fake, *real):
        assert m.error is None, f"{m.error.kind} in {m.error.phase}: {m.error.message}\n{m.error.traceback}"
    return fake, real


@pytest.mark.slow
def test_every_rank_runs_in_a_real_gloo_world(worlds):
    fake, real = worlds
    assert [m.spec.rank for m in real] == [0, 1]
    for m in real:
        assert m.spec.launcher == "torchrun"
        assert f"real world: rank {m.spec.rank} of 2 processes, backend gloo" in m.notes
    assert "torch.distributed.run" in real[0].command and "--nproc_per_node 2" in real[0].command
    # The real ranks gather the true weights: same model, same batches, same losses. The fake
    # all-gather copies rank 0's slice into every slice, so its model (and loss) differs.
    assert real[0].losses == real[1].losses
    assert fake.losses[0] != real[0].losses[0]


@pytest.mark.slow
def test_deepspeed_buffers_are_byte_identical_to_the_fake_world(worlds):
    fake, real = worlds
    for at in ("load", "initialize", "step"):
        expected = fake.items(at)
        assert expected
        for m in real:
            assert m.items(at) == expected, (m.spec.rank, at)
    assert all(m.model == fake.model for m in real)


@pytest.mark.slow
def test_host_memory_agrees_at_every_phase_boundary(worlds):
    fake, real = worlds
    for m in real:
        assert [(p.name, p.step) for p in m.phases] == [(p.name, p.step) for p in fake.phases]
        for f, r in zip(fake.phases, m.phases):
            if m.spec.rank != 0 and f.name == "save":
                continue  # only rank 0 builds the consolidated 16-bit state dict
            label = (m.spec.rank, f.name, f.step)
            assert (r.host_live_start_bytes, r.host_live_end_bytes) == (f.host_live_start_bytes, f.host_live_end_bytes), label
            assert (r.host_pinned_end_bytes, r.host_max_pinned_bytes) == (f.host_pinned_end_bytes, f.host_max_pinned_bytes), label


@pytest.mark.slow
def test_host_peaks_agree_up_to_the_gloo_staging_buffers(worlds):
    fake, real = worlds
    for f, r in zip(fake.phases, real[0].phases):
        extra = r.host_peak_bytes - f.host_peak_bytes
        if f.name in EXACT_PHASES:
            assert extra == 0, (f.name, extra)
        assert 0 <= extra <= GLOO_STAGING_BYTES, (f.name, f.step, extra)


@pytest.mark.slow
@pytest.mark.usefixtures("cpu_adam_built")
def test_a_rank_that_dies_stops_the_world_and_is_named():
    """Rank 1 is killed as partitioning starts; rank 0 would wait for it in a collective until the
    process group's timeout (30 min): torchrun stops it, and the result names rank, signal and phase."""
    spec = dataclasses.replace(CASES[CASE], threads=1, launcher="torchrun", steps=1, save="never",
                               fault="initialize.partition:kill:1")
    m = run_replay(spec, timeout_s=TIMEOUT_S)
    assert m.error is not None, "the run should have failed"
    assert (m.error.kind, m.error.phase, m.error.message) == ("killed", "initialize.partition",
                                                              "rank 1 killed by SIGKILL")
    # Rank 0's own phases, from its progress log: it was stopped at or just before partitioning.
    names = [p.name for p in m.phases]
    assert len(names) >= 2 and names == ["load", "initialize.cast", "initialize.move"][: len(names)]
    assert m.returncode != 0  # stopped by torchrun ("killed" above), not by our deadline ("timeout") or a 30 min collective


def test_torchrun_starts_w_children_that_write_one_file_per_rank():
    spec = dataclasses.replace(CASES[CASE], launcher="torchrun")
    assert child_argv(spec, "spec.json", "/w/out.json", python="py") == [
        "py", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "-m", "memfit.replay.child", "spec.json", "/w/out.json"]
    assert child_argv(CASES[CASE], "spec.json", "/w/out.json", python="py") == [
        "py", "-m", "memfit.replay.child", "spec.json", "/w/out.json"]
    assert [rank_output_path("/w/out.json", r) for r in range(3)] == [
        "/w/out.json", "/w/out.rank1.json", "/w/out.rank2.json"]


@pytest.mark.parametrize(
    "change",
    [{"launcher": "deepspeed"}, {"fault": "load:kill:2"}, {"fault": "load:kill:x"}, {"fault": "load:kill:"}],
)
def test_launcher_and_rank_faults_are_checked_with_one_line(change):
    with pytest.raises(MemfitError) as err:
        dataclasses.replace(CASES[CASE], **change)
    assert "\n" not in str(err.value)


def test_torchrun_reports_rank_0_only():
    assert dataclasses.replace(CASES[CASE], fault="load:kill:1").fault == "load:kill:1"
    with pytest.raises(MemfitError, match="rank 0"):
        run_replay(dataclasses.replace(CASES[CASE], launcher="torchrun", rank=1))
