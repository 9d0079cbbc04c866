"""memfit compare on the hand-made records: reconciliation, attribution by frames, the trace replay
and the simulator-check converter. The expected figures come from the generator's own constants
(tests/fixtures/records/make_synthetic.py), not from memfit."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import pickle
import subprocess
import sys

import pytest

from memfit.core.compare import reconcile
from memfit.core.compare.frames import EXTRA_RULES, FrameReader, plan_rules, where
from memfit.core.compare.phases import outside_allocator
from memfit.core.compare.simcheck import check_snapshot
from memfit.core.compare.trace import allocator_events, replay_levels
from memfit.core.plan import make_plan
from memfit.core.records import read_records
from memfit.core.records.snapshot import parse_snapshot
from memfit.core.records.types import StackFrame
from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.read import read_scenario_file

from conftest import FIXTURES, ROOT, SEED

RECORDS = FIXTURES / "records"
_spec = importlib.util.spec_from_file_location("make_synthetic", RECORDS / "make_synthetic.py")
gen = importlib.util.module_from_spec(_spec)
sys.modules["make_synthetic"] = gen  # dataclasses look their module up
_spec.loader.exec_module(gen)


@pytest.fixture(scope="module")
def seed():
    sc = build_scenario(read_scenario_file(SEED))
    return make_plan(sc), sc


@pytest.fixture(scope="module")
def rc(seed):
    plan, sc = seed
    return reconcile(plan, read_records([RECORDS / "seed-synthetic"]), capacity_bytes=sc.hardware.gpu.total_bytes)


def test_fixtures_are_what_the_generator_writes(tmp_path):
    gen.write_seed(tmp_path / "s")
    gen.write_allocator_exact(tmp_path / "a")
    for name in ("stats.rank0.json", "snapshot.rank0.pickle", "nvidia-smi.csv", "deepspeed.log"):
        assert (tmp_path / "s" / name).read_bytes() == (RECORDS / "seed-synthetic" / name).read_bytes(), name
    assert (tmp_path / "a" / "snapshot.pickle").read_bytes() == (RECORDS / "allocator-exact" / "snapshot.pickle").read_bytes()


def test_rows_phase_by_phase(rc, seed):
    plan, _ = seed
    rows = {r.phase: r for r in rc.rows}
    move = rows["initialize.move"]
    # 28 x 508,791,296 B weights + the 262,144 B buffers, requested bytes from the trace
    assert move.allocated.primary.source == "snapshot trace"
    assert move.allocated.primary.bytes == 28 * gen.PARAM + 262_144
    tensors = sum(i.bytes for i in plan.phase("initialize.move").items if i.device.value == "gpu" and not outside_allocator(i))
    assert move.allocated.diff_bytes == tensors - move.allocated.primary.bytes
    # reserved: 28 segments of 509,607,936 B and the 2 MiB small one, from the trace and from memory_stats alike
    assert [f.bytes for f in move.reserved.recorded[:2]] == [28 * gen.PARAM_SEG + 2 * gen.MiB] * 2
    # the plan's reserved figure is its allocator simulator run on the ledger's tensors (285 of them, where the
    # hand-made recording moves 28 lumps): an estimate, tagged so
    assert move.reserved.planned.bytes == plan.phase("initialize.move").gpu_reserved_bytes
    assert move.reserved.planned.source == "plan estimate"
    assert [f.source for f in move.nvidia_smi.recorded] == ["nvidia-smi", "mem_get_info"]
    assert rows["initialize.optimizer"].pinned.primary.bytes == 12 * 2**30
    assert rows["initialize"].allocated.primary.source == "deepspeed log"  # the first 'Engine before forward'
    # the plan has its own steady-state phases (step2.*): the recording's step 2 is compared with them
    assert rows["step2.backward"].plan_phases == ("step2.backward",) and not rows["step2.backward"].note
    assert rows["save"].allocated.recorded == () and rows["save"].allocated.planned.bytes > 0
    whole = rows["whole run"]
    reserved_peak = 28 * gen.PARAM_SEG + 2 * gen.MiB + 2 * gen.TEMP + gen.GRAD + 2 * gen.REDUCE_SEG
    assert whole.reserved.primary.bytes == reserved_peak and rc.simulator.recorded_reserved_peak_bytes == reserved_peak
    backward = rows["backward"].allocated.primary.bytes
    acts = gen.ACT_FIRST + 27 * gen.ACT_LAYER
    assert backward == 262_144 + 2 * gen.TEMP + gen.GATHER_BYTES + acts + gen.GRAD + 2 * gen.REDUCE


def test_attribution(rc):
    a = rc.attribution
    by = {p.phase: {k.keys: k for k in p.rows} for p in a.phases}
    move = by["initialize.move"][("move.buffers", "move.params")]  # both cite _configure_distributed_model
    assert move.recorded_bytes == move.planned_bytes == 28 * gen.PARAM + 262_144
    temps = by["initialize.optimizer"][("zero3.offload_gpu_temps",)]
    assert temps.recorded_bytes == temps.planned_bytes == 2 * gen.TEMP
    fwd = by["forward"]
    assert fwd[("step.activations",)].recorded_bytes == gen.ACT_FIRST + 27 * gen.ACT_LAYER
    assert fwd[("zero3.gathered_params",)].recorded_bytes == 2 * gen.GATHER_BYTES
    assert fwd[("zero3.persistent_params_full",)].recorded_bytes == 0
    bwd = {p.phase: p for p in a.phases}["backward"]
    assert by["backward"][("step.full_gradient",)].recorded_bytes == gen.GRAD  # via AccumulateGrad's C++ frame
    assert bwd.unattributed_bytes == 2 * gen.REDUCE
    # the reduce buffers are DeepSpeed's own: the generic autograd rule further out must not claim them
    (u,) = a.unplanned
    assert u.where == "deepspeed/runtime/zero/stage3.py:__reduce_and_partition_ipg_grads"
    assert (u.peak_live_bytes, u.count, u.phases) == (2 * gen.REDUCE, 4, ("backward", "step2.backward"))
    missing = {m.key: m.reason for m in a.missing}
    # plan items the hand-made recording has no allocation for: the persistent params, 0.5.10's
    # per-backward IPG buffers, the all-gather buffers and the offloaded gradient partitions' copies, and
    # the logits the outputs hold (its forward allocates only per-block activations; the loss's tensors,
    # made after the head released its params, are at no phase peak here)
    never = "never allocated in the recorded trace"
    assert missing == {"zero3.persistent_params_full": never, "zero3.ipg_buffers_per_backward": never,
                       "step.logits": never,
                       "zero3.allgather_flat_buffer": never, "zero3.allgather_partition_copy": never,
                       "zero3.grad_partition_gpu_copy": never, "zero3.grad_partition_fp32_copy": never,
                       "save.gathered_module": "its phases were not recorded"}
    assert any("runtime.cuda_context" in n for n in a.not_visible)


def test_frame_rules(seed):
    plan, _ = seed
    rules = {(r.file, r.function): r.keys for r in plan_rules(plan)}
    assert rules[("deepspeed/runtime/zero/stage3.py", "__init__")] == ("zero3.offload_gpu_temps",)
    assert rules[("engine.py", "_configure_distributed_model")] == ("move.buffers",)
    reader = FrameReader(plan)
    fr = lambda path, name: StackFrame(path, 1, name)  # noqa: E731
    sp = "/env/lib/python3.11/site-packages/"
    assert reader.keys_for((fr(sp + "torch/nn/functional.py", "linear"),
                            fr(sp + "transformers/models/gptj/modeling_gptj.py", "forward"))) == ("step.activations",)
    # the generic forward rule does not claim what DeepSpeed allocates inside the forward
    assert reader.keys_for((fr(sp + "deepspeed/runtime/zero/stage3.py", "_unknown_helper"),
                            fr(sp + "transformers/models/gptj/modeling_gptj.py", "forward"))) is None
    # ... but ZeRO-3's memory-efficient Linear is part of the activations
    assert reader.keys_for((fr(sp + "deepspeed/runtime/zero/linear.py", "forward"),)) == ("step.activations",)
    assert reader.keys_for((fr("x.cpp", "torch::autograd::AccumulateGrad::apply"),)) == ("step.full_gradient",)
    assert reader.keys_for(()) is None
    assert where(()) == "(no stack recorded)"
    assert where((fr(sp + "torch/nn/modules/module.py", "_call_impl"), fr("/home/u/train.py", "main"))) == "/home/u/train.py:main"  # fresh-ok: a recorded frame's file name, never opened
    assert all(r.origin.startswith("memfit:") for r in EXTRA_RULES)


def test_allocator_exact_converter():
    snap = read_records([RECORDS / "allocator-exact"]).snapshots[0]
    events = allocator_events(snap)
    ref, _ = gen.allocator_exact_events()
    assert [(e.action, e.addr, e.size, e.stream) for e in events] == [(d["action"], d["addr"], d["size"], d["stream"]) for d in ref]
    levels = replay_levels(snap)
    assert levels.consistent and levels.live_start == 0 and levels.reserved_start == 0
    assert max(levels.reserved) == (2 + 20 + 30) * gen.MiB
    assert levels.live[-1] == 4 + 1_048_576 + 4_000_000 + 12_000_000 + 30_000_000
    check = check_snapshot(snap, rank=0, device=0)
    assert check.recorded_reserved_peak_bytes == 52 * gen.MiB and check.events == len(ref)
    assert check.status in ("unavailable", "checked")


def test_simulator_check_when_available():
    """BRIEF contract 4: the alloc helper's simulator must reproduce the hand-made, rule-following sequence."""
    pytest.importorskip("memfit.core.alloc.cuda_caching", reason="no CUDA caching allocator simulator in this memfit yet")
    snap = read_records([RECORDS / "allocator-exact"]).snapshots[0]
    check = check_snapshot(snap, rank=0, device=0)
    assert check.status == "checked" and check.divergences == ()
    assert check.simulated_reserved_peak_bytes == check.recorded_reserved_peak_bytes == 52 * gen.MiB


def test_trace_that_starts_late():
    snap = read_records([RECORDS / "seed-synthetic"]).snapshots[0]
    trace = snap.traces[0]
    late = dataclasses.replace(snap, traces=(dataclasses.replace(trace, events=trace.events[60:]),))
    levels = replay_levels(late)
    assert levels.consistent and levels.live_start > 0 and levels.reserved_start > 0
    full = replay_levels(snap)
    assert levels.live == full.live[60:] and levels.reserved == full.reserved[60:]  # exact, reconstructed backwards
    assert check_snapshot(late, rank=0, device=0).status == "not exact"
    broken = dataclasses.replace(snap, segments=snap.segments[:3])
    assert not replay_levels(broken).consistent


def test_timeline(rc):
    tl = rc.timeline
    assert len(tl.phases) == 11 and tl.capacity_bytes == 25_438_126_080
    for s in tl.recorded:
        assert all(0 <= p.x <= len(tl.phases) for p in s.points)
    trace = next(s for s in tl.recorded if s.label.startswith("allocated, requested"))
    assert max(p.bytes for p in trace.points) == 28 * gen.PARAM + 262_144  # the peak survives thinning


def test_snapshot_only_and_smi_only(seed, tmp_path):
    plan, _ = seed
    only = reconcile(plan, read_records([RECORDS / "seed-synthetic" / "snapshot.rank0.pickle"]))
    whole = only.rows[-1]
    assert whole.phase == "whole run" and whole.allocated.primary.bytes == 28 * gen.PARAM + 262_144
    assert [p.phase for p in only.attribution.phases] == ["whole run"]
    smi = reconcile(plan, read_records([RECORDS / "seed-synthetic" / "nvidia-smi.csv"]))
    assert smi.rows[-1].nvidia_smi.primary.source == "nvidia-smi" and smi.attribution is None


def test_no_torch_and_rank_errors(seed):
    plan, _ = seed
    from memfit.errors import MemfitError

    with pytest.raises(MemfitError, match="--rank 3"):
        reconcile(plan, read_records([RECORDS / "seed-synthetic"]), rank=3)
    code = ("import sys; from memfit.core.plan import make_plan; from memfit.core.scenario.build import build_scenario; "
            "from memfit.core.scenario.read import read_scenario_file; from memfit.core.records import read_records; from memfit.core.compare import reconcile; "
            "from memfit.render.compare_out import reconciliation_to_dict; "
            f"rc = reconcile(make_plan(build_scenario(read_scenario_file({str(SEED)!r}))), "
            f"read_records([{str(RECORDS / 'seed-synthetic')!r}])); reconciliation_to_dict(rc); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr


def test_cli_compare(tmp_path):
    cmd = [sys.executable, "-m", "memfit.cli", "compare", str(SEED), str(RECORDS / "seed-synthetic")]
    r = subprocess.run(cmd + ["--json"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["schema"] == "memfit.compare" and d["schema_version"] == 1
    assert {p["phase"] for p in d["phases"]} >= {"initialize.move", "backward", "whole run"}
    assert d["attribution"]["unplanned"][0]["peak_live_bytes"] == 2 * gen.REDUCE
    doc = (ROOT / "docs" / "compare-json.md").read_text()  # every key the output has is documented
    keys = set(d) | set(d["phases"][0]) | set(d["phases"][0]["allocated"]) | set(d["records"][0]) | \
        set(d["simulator"] or {}) | set(d["attribution"]) | set(d["attribution"]["phases"][0]) | \
        set(d["attribution"]["phases"][0]["items"][0]) | set(d["attribution"]["unplanned"][0])
    assert not {k for k in keys if f'"{k}"' not in doc}, "docs/compare-json.md misses these keys"
    md = tmp_path / "c.md"
    r = subprocess.run(cmd + ["--report", str(md)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    text = md.read_text()
    assert "| initialize.move |" in text and "data:image/svg+xml;base64," in text and "## The plan" in text
    r = subprocess.run(cmd + ["--report", str(md)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and "never overwrites" in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"load": {"allocated_bytes.all.peak": -1}}')
    r = subprocess.run(cmd[:-1] + [str(bad)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "negative" in r.stderr
    import os

    r = subprocess.run([sys.executable, "-m", "memfit.cli", "compare", "--help"], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "COLUMNS": "300"})
    assert r.returncode == 0 and "see_memory_usage" in r.stdout and "nvidia-smi" in r.stdout


def test_parse_snapshot_from_generator_dict():
    _, snap = gen.allocator_exact_events()
    parsed = parse_snapshot(pickle.loads(pickle.dumps(snap)))
    assert [s.total_size for s in parsed.segments] == [2 * gen.MiB, 20 * gen.MiB, 30 * gen.MiB]


def test_state_only_snapshot_attributes_its_blocks(seed):
    """history recorded with enabled="state": no trace, the live blocks and their frames only."""
    plan, _ = seed
    snap = read_records([RECORDS / "seed-synthetic"]).snapshots[0]
    from memfit.core.records.types import RecordSet

    rc = reconcile(plan, RecordSet(snapshots=(dataclasses.replace(snap, traces=()),)))
    (p,) = rc.attribution.phases
    rows = {k.keys: k for k in p.rows}
    # at the dump the run had freed everything but the buffers and DeepSpeed 0.5's offload temporaries
    assert rows[("zero3.offload_gpu_temps",)].recorded_bytes == 2 * gen.TEMP
    assert rows[("move.buffers", "move.params")].recorded_bytes == 262_144
    assert p.phase == "at the snapshot" and rc.simulator.status == "no trace"
