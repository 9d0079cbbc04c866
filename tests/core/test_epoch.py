"""The epoch simulation (issue 19 item 1): its shortcuts against the long way round.

The simulation replays steps of varying lengths through one CUDA caching allocator simulator
(``core/alloc``, itself checked against torch's allocator in tests/core/test_alloc_*.py). It takes two
shortcuts, each checked here against what the recipes themselves write:

- the step template (``core/epoch/template.py``): each event's size fitted as a polynomial in the
  length from three timelines; at other lengths it must equal, event for event and byte for byte,
  the timeline the recipes write at that length (torch + LoRA, DeepSpeed ZeRO-3 + offload, FSDP2);
- the memo and the event budget (``core/epoch/simulate.py``): an epoch run with them must give, step
  by step, the same figures as one that simulates every step from the recipes' own timelines, with
  the default allocator settings, with ``expandable_segments`` and with the Trainer's
  ``torch_empty_cache_steps``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from memfit.core.epoch.simulate import run_epoch, seeded_run
from memfit.core.epoch.template import STEP_END, STEP_START, StepTemplate, resolve_windows
from memfit.core.ledger.build import build_events_timeline, build_timeline
from memfit.core.plan import make_plan
from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.inputs import ScenarioInputs
from memfit.core.scenario.read import read_scenario_file
from memfit.core.scenario.types import EvalSettings

ROOT = Path(__file__).resolve().parents[2]
WINDOWS = (("forward", ("step2.forward",)), (STEP_START, STEP_END))
LORA = dict(model="meta-llama/Llama-2-7b-hf", peft_method="lora", gpus="1xrtx4090", framework="torch", precision="bf16",
            load_dtype="bf16", micro_batch=2, gradient_checkpointing=True, seq_len=1024)


def _scenarios():
    return {
        "torch-lora": build_scenario(ScenarioInputs(**LORA)),
        "deepspeed-zero3-offload": build_scenario(replace(read_scenario_file(ROOT / "examples" / "kogpt-prefix-zero3-offload.yaml"),
                                                          seq_len=256)),
        "fsdp2-offload": build_scenario(replace(read_scenario_file(ROOT / "examples" / "frameworks" / "fsdp2-offload-llama3-8b-8gpu.yaml"),
                                                seq_len=512)),
    }


def _at(sc, length: int):
    return replace(sc, train=replace(sc.train, seq_len=length), eval=EvalSettings())


def _templates(sc):
    L = sc.train.seq_len
    steps = {x: resolve_windows(build_events_timeline(_at(sc, x)), WINDOWS) for x in (L, L // 2, L // 4)}
    return (StepTemplate.build({x: r[0] for x, r in steps.items()}),
            StepTemplate.build({x: r[1] for x, r in steps.items()}), steps[L][0])


@pytest.mark.parametrize("name", ["torch-lora", "deepspeed-zero3-offload", "fsdp2-offload"])
def test_the_template_is_the_recipes_step_at_other_lengths(name):
    sc = _scenarios()[name]
    first, steady, _ = _templates(sc)
    L = sc.train.seq_len
    for x in (3 * L // 8, 5 * L // 8, L // 3 + 1):
        real = resolve_windows(build_events_timeline(_at(sc, x)), WINDOWS)
        for tp, r in ((first, real[0]), (steady, real[1])):
            sizes, inexact = tp.sizes(x)
            assert inexact == 0
            assert [(k, t) for k, t in zip(tp.kinds, tp.tids)] == [o[:2] for o in r.ops]
            assert list(sizes) == [o[2] for o in r.ops], f"{name} at {x} tokens"


def _fraction_coeffs(ls, sizes):
    """The fit the long way round: each Lagrange basis polynomial in Fractions, each coefficient reduced,
    over the lcm of their denominators."""
    from fractions import Fraction
    from math import lcm

    if len(set(sizes)) == 1:
        return (0, 0, sizes[0], 1)
    total = [Fraction(0)] * 3
    for i, xi in enumerate(ls):
        p, q = (x for k, x in enumerate(ls) if k != i)
        den = Fraction((xi - p) * (xi - q))
        for j, v in enumerate((1, -(p + q), p * q)):
            total[j] += sizes[i] * v / den
    d = lcm(*(t.denominator for t in total))
    return tuple(int(t * d) for t in total) + (d,)


def test_the_integer_fit_is_the_fraction_fit():
    """``StepTemplate.build`` fits in integers; each op's (a, b, c, d) must be the reduced Fraction fit."""
    import random

    from memfit.core.epoch.template import Resolved

    rng = random.Random(7)
    for ls in ((256, 512, 1024), (100, 101, 102), (3, 17, 1000), (1, 2, 4)):
        ops = []
        for tid in range(400):
            a, b, c = rng.choice((0, 0, rng.randrange(1, 99))), rng.randrange(0, 2**20), rng.randrange(0, 2**30)
            ops.append([a * x * x + b * x + c + rng.choice((0, 0, 0, rng.randrange(1, 4096))) for x in ls])
        ops.append([4096] * 3)
        ops.append([4096 * (ls[2] - x) for x in ls])  # linear, falling: below 0 past ls[2]
        steps = {x: Resolved(ops=tuple((True, t, o[i]) for t, o in enumerate(ops)), keys=("k",) * len(ops), carry_in=(),
                             carry_out=(), backward_at=0, optimizer_at=0, before=(), outside_bytes=0)
                 for i, x in enumerate(ls)}
        tp = StepTemplate.build(steps)
        assert list(tp.coeffs) == [_fraction_coeffs(ls, o) for o in ops], ls
        for i, x in enumerate(ls):
            assert tp.sizes(x) == (tuple(o[i] for o in ops), 0)
        for x in (ls[0] // 2 + 1, ls[2] + 37, 3 * ls[2]):  # elsewhere: the fit's value, rounded up, never below 0
            want = [-(-(a * x * x + b * x + c) // d) for a, b, c, d in map(lambda o: _fraction_coeffs(ls, o), ops)]
            inexact = sum(1 for a, b, c, d in map(lambda o: _fraction_coeffs(ls, o), ops) if (a * x * x + b * x + c) % d)
            assert tp.sizes(x) == (tuple(max(w, 0) for w in want), inexact), (ls, x)


class RecipeSteps:
    """A step source written by the recipes at each length asked (no template)."""

    def __init__(self, sc, which: int) -> None:
        self.sc, self.which, self.cache = sc, which, {}
        r = self._resolved(sc.train.seq_len)
        self.kinds, self.tids = tuple(o[0] for o in r.ops), tuple(o[1] for o in r.ops)
        self.carry_in, self.carry_out = r.carry_in, r.carry_out
        self.backward_at, self.optimizer_at = r.backward_at, r.optimizer_at

    def _resolved(self, x: int):
        if x not in self.cache:
            self.cache[x] = resolve_windows(build_events_timeline(_at(self.sc, x)), WINDOWS)[self.which]
        return self.cache[x]

    def sizes(self, x: int):
        return tuple(o[2] for o in self._resolved(x).ops), 0


LENGTHS = (512, 1024, 256, 768, 1024, 512, 256, 896, 1024, 384, 512, 768, 256, 1024, 640, 512, 256, 1024, 768, 512)


@pytest.mark.parametrize("alloc_conf,empty", [("", None), ("expandable_segments:True", None), ("", 3),
                                              ("garbage_collection_threshold:0.6,per_process_memory_fraction:0.9", None)])
def test_memo_and_template_give_every_step_s_figures(alloc_conf, empty):
    sc = build_scenario(ScenarioInputs(**LORA, alloc_conf=alloc_conf or None))
    first, steady, step1 = _templates(sc)
    conf = build_timeline(sc).tracker.gpu.conf
    fast = run_epoch(seeded_run(sc, conf, step1), first, steady, LENGTHS, empty_n=empty, outside=step1.outside_bytes)
    slow = run_epoch(seeded_run(sc, conf, step1), RecipeSteps(sc, 0), RecipeSteps(sc, 1), LENGTHS, empty_n=empty,
                     outside=step1.outside_bytes, memo=False)
    # the memo skipped steps (with empty_cache every 3 steps the flushed cache gets new addresses: no repeat)
    assert slow.simulated == len(LENGTHS) and (empty or fast.simulated < len(LENGTHS))
    assert [(f.reserved, f.oom, f.allocated, f.phases) for f in fast.figures] == \
        [(f.reserved, f.oom, f.allocated, f.phases) for f in slow.figures]


def test_shorter_batches_reuse_and_split_the_longest_s_blocks():
    """After a long batch the cache holds its segments: reserved never drops (no empty_cache). With the
    Trainer's empty_cache after every forward the median step reserves less, though its peak need
    not be lower: the backward of a flushed step allocates afresh beside the live activations."""
    sc = build_scenario(ScenarioInputs(**LORA))
    first, steady, step1 = _templates(sc)
    conf = build_timeline(sc).tracker.gpu.conf
    out = run_epoch(seeded_run(sc, conf, step1), first, steady, LENGTHS, empty_n=None, outside=step1.outside_bytes)
    reserved = [f.reserved for f in out.figures]
    assert reserved == sorted(reserved)  # never released
    flushed = run_epoch(seeded_run(sc, conf, step1), first, steady, LENGTHS, empty_n=1, outside=step1.outside_bytes)
    assert sorted(f.reserved for f in flushed.figures)[len(LENGTHS) // 2] < sorted(reserved)[len(LENGTHS) // 2]


def test_the_plan_reports_the_epoch(tmp_path):
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("".join(f"{n}\n" for n in [100, 300, 900, 1500, 2000] * 200))
    r = subprocess.run([sys.executable, "-m", "memfit.cli", "plan", "--model", "meta-llama/Llama-2-7b-hf", "--peft", "lora",
                        "--gpus", "1xrtx4090", "--framework", "torch", "--precision", "bf16", "--load-dtype", "bf16",
                        "--micro-batch", "2", "--gradient-checkpointing", "--lengths", str(lengths), "--max-seq-length",
                        "2048", "--empty-cache-steps", "50", "--json"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    e = d["epoch"]
    assert e["steps"] == 500 and e["distinct_lengths"] > 1 and not e["error"]
    assert e["reserved_p50_bytes"] <= e["reserved_p99_bytes"] <= e["reserved_max_bytes"]
    assert e["oom_relevant_p50_bytes"] <= e["oom_relevant_p99_bytes"] <= e["oom_relevant_max_bytes"]
    assert 1 <= e["peak_step"] <= 500 and e["peak_shape_steps"] >= 1
    names = [p["name"] for p in d["phases"]]
    assert names.index("epoch.forward") == names.index("step2.optimizer_step") + 1
    peak = next(p for p in d["phases"] if p["name"] == "epoch.forward")
    assert peak["gpu_reserved_bytes"] == e["peak_phase_figures"][0]["gpu_reserved_bytes"]
    assert any("Epoch (500 optimizer steps" in n for n in d["notes"])


def test_no_distribution_is_an_assumption_said_out_loud():
    plan = make_plan(build_scenario(ScenarioInputs(**LORA, epoch=True, epoch_steps=50)))
    assert plan.epoch is not None and plan.epoch.lengths_source.startswith("assumed: memfit's default")
    assert any("assumed: memfit's default: log-normal" in n for n in plan.notes)


def test_group_by_length_puts_the_longest_batch_first_and_pack_is_fixed(tmp_path):
    from memfit.core.batch_shapes import read_lengths
    from memfit.core.epoch.shapes import epoch_shapes

    p = tmp_path / "l.txt"
    p.write_text("".join(f"{n}\n" for n in range(10, 1000, 7)))
    dist = read_lengths(p)
    b = epoch_shapes(dist, rule="bucket", micro_batch=4, world=1, grad_accum=1, steps=30, max_seq_length=None, seed=1,
                     source="t")
    assert b.lengths[0] == max(b.lengths)
    k = epoch_shapes(dist, rule="pack", micro_batch=4, world=1, grad_accum=1, steps=30, max_seq_length=512, seed=1,
                     source="t")
    assert set(k.lengths) == {512}


@pytest.mark.parametrize("rule", ["pad-longest", "bucket"])
def test_the_shapes_are_the_sampler_s_draws(rule):
    """``epoch_shapes`` draws with cumulative counts; the batches must be those of ``choices(weights=counts)``
    (the sampler's draw, written out here) with the same seed."""
    import random

    from memfit.core.batch_shapes import LengthDistribution
    from memfit.core.epoch.shapes import MEGABATCH_MULT, epoch_shapes, shape_quantum

    rng = random.Random(3)
    lengths = tuple(sorted(rng.sample(range(8, 3000), 200)))
    dist = LengthDistribution(lengths=lengths, counts=tuple(rng.randrange(1, 50) for _ in lengths), source="test")
    b, world, ga, steps, cap = 4, 2, 3, 300, 2048
    got = epoch_shapes(dist, rule=rule, micro_batch=b, world=world, grad_accum=ga, steps=steps, max_seq_length=cap,
                       seed=11, source="test")
    draw = random.Random(11)
    cut = [min(n, cap) for n in dist.lengths]
    rows = []
    while len(rows) < steps * ga:
        if rule == "bucket":
            mega = draw.choices(cut, weights=dist.counts, k=MEGABATCH_MULT * b * world)
            if not rows:
                mega[0] = max(cut)
            mega.sort(reverse=True)
            rows.extend([mega[i:i + b] for i in range(0, len(mega), b)][::world][k][0]
                        for k in range(len(range(0, len(mega), b)[::world])))
        else:
            rows.append(max(draw.choices(cut, weights=dist.counts, k=b)))
    q = shape_quantum(max(cut))
    want = tuple(min(-(-max(rows[i * ga:(i + 1) * ga]) // q) * q, cap) for i in range(steps))
    assert got.lengths == want
