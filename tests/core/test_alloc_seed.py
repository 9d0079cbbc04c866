"""The allocator figures of the seed plan (kogpt prefix tuning, ZeRO-3 + CPU offload), each derived
here independently from the ledger's tensors and torch's rules, then compared with the plan."""

import pytest

from conftest import SEED
from memfit.core.alloc.non_pytorch import CUBLAS_WORKSPACE, non_pytorch_gpu
from memfit.core.alloc.versions import resolve_torch_version
from memfit.core.ledger.build import build_timeline
from memfit.core.plan import make_plan
from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.inputs import ScenarioInputs, merge_inputs
from memfit.core.scenario.read import read_scenario_file

MiB = 2**20


def seed(**kw):
    return build_scenario(merge_inputs(read_scenario_file(SEED), ScenarioInputs(**kw)))


def pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


@pytest.fixture(scope="module")
def plan19():
    return make_plan(seed(ds_version="0.19", torch_version="2.13"))


@pytest.fixture(scope="module")
def plan05():
    return make_plan(seed(ds_version="0.5", torch_version="1.10"))


def test_pinned_locked_ds019_torch213(plan19):
    """DeepSpeed 0.19 pins every param's ceil(p/2) fp16 partition (pin_memory(): PowerOf2Ceil each), then
    the trained ones are freed into the 16-bit flat buffer and stay cached in their buckets; the flat
    buffer (956,575,744 B -> 2^30) and the fp32 gradients (1,913,151,488 B -> 2^31) are new blocks; the
    gradient-partition buffer (956,575,744 B, bucket 30) reuses the cached 2^30 block freed by the
    encoder's 939,524,096 B partition. Nothing is ever returned, so the peak is the end."""
    sc = seed(ds_version="0.19")
    parts = [((p.numel + 1) // 2) * 2 for p in sc.model.params]            # ceil(p/W) x 2 B, W = 2
    trained = [((p.numel + 1) // 2) * 2 for p in sc.model.params if p.trainable]
    assert sorted(trained) == [4_096, 40_960, 229_376, 16_777_216, 939_524_096]
    expected = sum(pow2(b) for b in parts) + pow2(956_575_744) + pow2(1_913_151_488)  # flat + fp32 grads
    assert expected == 10_486_968_320      # the figure the reference reading also reached
    locked = max(p.cpu_pinned_locked_bytes for p in plan19.phases)
    assert locked == expected
    requested = max(p.cpu_pinned_requested_bytes for p in plan19.phases)
    assert requested == sum(parts) - sum(trained) + 956_575_744 + 1_913_151_488 + 956_575_744
    # the items are those live at the phase's host peak; the cache then holds every freed trained
    # partition, less the 2^30 block once the gradient-partition buffer has taken it
    opt = plan19.phase("initialize.optimizer")
    cache = [i for i in opt.items if i.key == "alloc.pinned_cache"]
    reused = any(i.key == "zero3.grad_partitions_flat" for i in opt.items)
    assert cache and cache[0].locked_bytes == sum(pow2(b) for b in trained) - (2**30 if reused else 0)
    final = plan19.phase("optimizer_step")
    assert [i.locked_bytes for i in final.items if i.key == "alloc.pinned_cache"] == [sum(pow2(b) for b in trained) - 2**30]


def test_pinned_locked_ds05_torch110(plan05):
    """torch 1.10 pins exact sizes and caches forever; DeepSpeed 0.5.10 allocates the flat buffer pinned
    directly and its CPU-Adam pins 2 x 128 Mi floats with cudaMallocHost (outside torch's cache). The
    freed trained partitions (956,575,744 B in all) stay locked: no later request fits in them except
    by best fit, and the only later pinned request (fp32 gradients, 1,913,151,488 B) is larger."""
    sc = seed(ds_version="0.5")
    parts = sum(((p.numel + 1) // 2) * 2 for p in sc.model.params)
    expected = 2 * 134_217_728 * 4 + parts + 956_575_744 + 1_913_151_488
    assert max(p.cpu_pinned_locked_bytes for p in plan05.phases) == expected == 11_066_547_200
    assert max(p.cpu_pinned_requested_bytes for p in plan05.phases) == expected - 956_575_744
    tiles = [i for i in plan05.phase("initialize.optimizer").items if i.key == "cpu_adam.pinned_tiles"]
    assert tiles[0].locked_bytes == tiles[0].bytes == 1_073_741_824


def _best_fit_small_segments(sizes):
    """Independent packing of the small pool: each rounded request takes the smallest free piece that
    fits (best fit), else a new 2 MiB segment; nothing is freed while the model moves."""
    free, segments = [], 0
    for s in sizes:
        fits = [f for f in free if f >= s]
        if fits:
            f = min(fits)
            free.remove(f)
            if f - s >= 512:
                free.append(f - s)
        else:
            segments += 1
            free.append(2 * MiB - s)
    return segments


def test_initialize_move_reserved_vs_allocated(plan19):
    """The whole-model move, one tensor per parameter (fp16) and the buffers: allocated is the sum of
    512-B-rounded blocks; reserved is every large tensor's segment (rounded to 2 MiB; kogpt's weights
    already are multiples) plus the 2 MiB small segments the small tensors pack into."""
    t = build_timeline(seed(ds_version="0.19"))
    sizes = [n for op, key, dev, n in t.events if op == "alloc" and key in ("move.params", "move.buffers")]
    rounded = [-(-n // 512) * 512 for n in sizes]
    large = [r for r in rounded if r > MiB]
    small = [r for r in rounded if r <= MiB]
    move = plan19.phase("initialize.move")
    assert move.gpu_allocated_bytes == sum(rounded) == 14_246_680_576
    assert move.gpu_reserved_bytes == (sum(-(-r // (2 * MiB)) * 2 * MiB if r >= 10 * MiB else 20 * MiB for r in large)
                                       + 2 * MiB * _best_fit_small_segments(small)) == 14_248_050_688
    # after partitioning, nothing is allocated but the cache keeps the segments (DeepSpeed#4700's pattern)
    part = plan19.phase("initialize.partition")
    assert part.gpu_reserved_bytes == move.gpu_reserved_bytes


def test_gpu_figures_are_ordered_and_the_verdict_uses_oom_relevant(plan19):
    outside = non_pytorch_gpu("rtx3090", torch=resolve_torch_version("2.13"), cuda="12.8", world_size=2).outside_bytes
    for ph in plan19.phases:
        assert ph.allocators_simulated
        assert ph.gpu_allocated_bytes <= ph.gpu_oom_relevant_bytes <= ph.gpu_reserved_bytes + ph.gpu_outside_pytorch_bytes
        assert ph.gpu_nvidia_smi_bytes == ph.gpu_reserved_bytes + ph.gpu_outside_pytorch_bytes or ph.name == "load"
        assert ph.cpu_pinned_requested_bytes <= ph.cpu_pinned_locked_bytes
    assert plan19.phase("initialize.move").gpu_outside_pytorch_bytes == outside == 256 * MiB + round(544 * MiB / 24 * 2)
    assert plan19.verdict.fits and "OOM-relevant" in plan19.verdict.gpu_figure
    fwd = plan19.phase("forward")
    ws = [i for i in fwd.items if i.key == "runtime.cublas_workspace"]
    assert ws and ws[0].bytes == CUBLAS_WORKSPACE == 8_519_680 and ws[0].block_bytes == 8_519_680
    assert not ws[0].outside_allocator       # torch >= 1.13: through the caching allocator


def test_an_alloc_conf_changes_the_figures():
    base = make_plan(seed(ds_version="0.19"))
    exp = make_plan(seed(ds_version="0.19", alloc_conf="expandable_segments:True"))
    b, e = base.phase("backward"), exp.phase("backward")
    requested = sum(i.bytes for i in e.items if i.device.value == "gpu" and not i.outside_allocator)
    # expandable segments split any remainder >= 512 B: blocks only shrink, never below the requests
    assert requested <= e.gpu_allocated_bytes <= b.gpu_allocated_bytes
    assert e.gpu_reserved_bytes < b.gpu_reserved_bytes                     # pages, not whole segments, per request
    assert "expandable_segments:True" in exp.notes[1]


def test_cpu_accelerator_has_no_simulation():
    p = make_plan(seed(ds_version="0.19", accelerator="cpu"))
    for ph in p.phases:
        assert not ph.allocators_simulated and ph.gpu_reserved_bytes == 0
        assert ph.node_cpu_locked_peak_bytes == ph.node_cpu_peak_bytes
    assert "CPU accelerator" in p.notes[1]


def test_llama2_7b_zero3_full_offload_w8_pinned():
    """Issue 8's second example: Llama-2-7B full fine-tuning, ZeRO-3 with param and optimizer offload
    (pinned), 8 GPUs. Every param's ceil(p/8) bf16 partition is pinned (PowerOf2Ceil each) and then
    freed into the flat buffer, staying cached (no later request lands in their buckets); the flat
    buffer and the gradient partitions (842,301,952 x 2 B -> 2^31 each) and the fp32 gradients (one sub
    group, x 4 B -> 2^32) are new blocks."""
    ds = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-5}},
          "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                                "offload_param": {"device": "cpu", "pin_memory": True}}}
    sc = build_scenario(ScenarioInputs(model="meta-llama/Llama-2-7b-hf", deepspeed_inline=ds, gpus="8xa100-80gb"))
    parts = [-(-p.numel // 8) * 2 for p in sc.model.params]
    n_part = sum(-(-p.numel // 8) for p in sc.model.params)
    assert n_part == 842_301_952
    expected = sum(pow2(b) for b in parts) + pow2(n_part * 2) * 2 + pow2(n_part * 4)
    p = make_plan(sc)
    # requested peaks once the partitions are freed: flat (2 B) + fp32 grads (4 B) + grad partitions (2 B)
    assert max(x.cpu_pinned_requested_bytes for x in p.phases) == n_part * 8 == 6_738_415_616
    assert max(x.cpu_pinned_locked_bytes for x in p.phases) == expected == 10_804_593_664
