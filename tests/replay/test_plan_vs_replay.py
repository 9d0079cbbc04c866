"""The plan against real DeepSpeed runs, without running anything heavy: every replay fixture in
tests/fixtures/replay (recorded by `python -m memfit.replay.deepspeed.record_fixtures`, real
deepspeed.initialize + 2 training steps on the CPU accelerator, rank 0 of a W-rank fake world) is
re-planned by the pure core and compared (``memfit.replay.compare.compare_replay``).

What is compared, and how tightly:
- every size the replay read off DeepSpeed's and the model's objects (``ITEM_RULES``: partitions,
  flat buffers, fp32 masters, gradient buffers, reduce buckets, optimizer states, the loaded
  model), after initialize and after the first step: 0 bytes, and 0 bytes of their pinned part; a
  key the replay did not report, or one no rule compares, fails;
- each item's measured pinned bytes (storages passed through ``pin_memory``) against DeepSpeed's
  own flag for those tensors (``offload_*_pin_memory``, read off its optimizer);
- per phase (step phases: step 1), the pinned part of the host peak and of what is live at the
  end: 0 bytes; the pageable part then follows from the host peak below;
- per phase, the host tensor peak, within the tolerances below, each with what it leaves out.
  The forward and backward peaks are checked tightly, with activations traced for the CPU kernels
  the replay runs, in test_activations_vs_replay.py; here the plan's own (analytic, CUDA-kernel)
  activations are checked only loosely.
"""

import glob
from pathlib import Path

import pytest

from memfit.replay.compare import compare_replay
from memfit.replay.deepspeed.compare import ITEM_RULES
from memfit.replay.measurement import load_fixture

FIXTURES = sorted(glob.glob(str(Path(__file__).resolve().parents[1] / "fixtures" / "replay" / "*.json")))
SEED_FIXTURES = sorted(glob.glob(str(Path(__file__).resolve().parents[1] / "fixtures" / "replay_seed" / "*.json")))
"""The seed scenario itself (kogpt shapes, the issue's DeepSpeed config verbatim, 1 layer), recorded by
`memfit replay examples/kogpt-prefix-zero3-offload.yaml --layers 1 --seq-len 16 --steps 1 --save-fixture ...`."""
ALL = FIXTURES + SEED_FIXTURES
IDS = [Path(p).stem for p in ALL]

TOL_INIT_BYTES = 162
"""load and initialize.*: memory the ledger does not list: peft's prompt_tokens index tensor (8 B
per virtual token) and DeepSpeed's 1-byte overflow flag. Worst seen: 81 B (the seed replay's
initialize.optimizer: 10 virtual tokens x 8 B + 1 B); 2x that. Measured above what the child held
before the model was built (``PhaseComparison.baseline_bytes``: 16 B on one machine, 144 B on
another)."""
TOL_STEP_OPT_BYTES = 410
"""optimizer_step and step2.optimizer_step: the step's scalars the ledger does not list (0-dim
norms, the overflow flag, step counters). Worst seen: 205 B (GPT-J full fine-tuning, ZeRO-3
offload, step 2); 2x that. (It was 14,310 B = 2 x 7,155 B while ZeRO-3 without offload peaked below
the plan by about its persistent params: step() releases every gathered param first,
``_partition_all_parameters``, and _post_step gathers them again; its peak was then the fp64 copy
of the largest gradient partition for the norm, ``get_grad_norm_direct``, both now in the ledger.)"""
TOL_SAVE_REL = 0.338
"""save: not modelled is how ``_zero3_consolidated_16bit_state_dict`` runs on the CPU accelerator.
There ``param.detach().cpu()`` returns the gathered tensor itself, so the gathered module and its
host copy are one tensor (the ledger books both on a GPU machine's terms: +256,000 B, the largest
module, in every ZeRO-3 fixture with W >= 2); and with W = 1 GatheredParameters still gives some
modules a new buffer the state dict keeps (logged: GPT-J's wte and its q/k/v/out projections,
256,000 + 8 x 32,768 = 518,144 B, where the ledger books none). Worst seen: 16.9% (ZeRO-3, W = 1,
-518,261 B); 2x that."""
TOL_STEP_REL = 0.361
"""forward/backward with the plan's analytic activations, computed for CUDA kernels (the CPU
kernels the replay runs save other tensors; the tight check of these phases is
test_activations_vs_replay.py). The worst is ZeRO-3 LoRA's step-1 backward, the replay above the
plan by 258,809-269,225 B: at the LM head's backward matmul (``LinearFunctionForZeroStage3Backward``:
``grad_output.matmul(weight)``) the CPU kernel allocates a 370,432 B transient inside ``aten::mm``,
logged in every fixture at that point, which a CUDA matmul does not (cuBLAS's workspace is
booked once, ``non_pytorch``); without it the plan is 3.8-4.9% above. Everything else is within 5%
(ZeRO-3's parameter gathers are simulated per module and hook, test_coordinator_vs_replay.py).
Worst seen: 18.0% (llama_lora_z3_offload_w2_gc backward); 2x that. (It was 0.423 = 2 x 21.2%
before the fixes to ZeRO-3's backward fetch order, ZeRO-1's buckets, ZeRO-2's partition and the
segment placement; GPT-J prefix step2.backward was 28.4% then.)"""
TOL_ZERO_INIT_LOAD_REL = 0.626
"""load of a zero.Init build from a config (random init): transformers initialises the weights of a
zero.Init model through GatheredParameters; the ledger models loading a checkpoint (the real use),
not that random initialisation. Worst seen: 31.3%; 2x that."""
INIT_PHASES = ("load", "initialize.cast", "initialize.move", "initialize.partition", "initialize.optimizer")


def _comparison(path):
    m = load_fixture(path)
    assert m.ok, f"{path}: the replay failed: {m.error}"
    return m, compare_replay(m)


def test_every_step_phase_is_compared():
    """Each fixture's plan phases all find their replay occurrences (two steps recorded)."""
    for path in FIXTURES:
        m, c = _comparison(path)
        names = {p.phase for p in c.phases}
        expected = {"forward", "backward", "optimizer_step", "step2.forward", "step2.backward", "step2.optimizer_step"}
        if m.deepspeed_config_used.get("gradient_accumulation_steps", 1) > 1:
            expected |= {"accum.forward", "accum.backward"}
        assert expected <= names, (path, expected - names)


def test_fixtures_cover_the_issue_cases():
    names = {Path(p).stem for p in FIXTURES}
    assert any("z2" in n and "prefix" in n for n in names) and any("z3" in n and "prefix" in n for n in names)
    assert any("lora" in n for n in names)
    assert any("offload" in n for n in names) and any("offload" not in n for n in names)
    assert {w for n in names for w in (1, 2, 4) if n.endswith(f"w{w}") or f"_w{w}_" in n} == {1, 2, 4}


KNOWN_LEDGER_GAPS: dict[tuple[str, str], tuple[int, int]] = {}
"""Items where the ledger is known to differ from DeepSpeed: (case, key@at) -> (plan, replay) bytes.
Empty: the one listed before (zero.Init's never-cast fp32 persistent adapters, 7,248 vs 8,400 B) is
fixed on main. A new entry makes the test fail until the ledger is fixed and the entry removed."""


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_every_measured_item_is_byte_exact_with_its_pinned_part(path):
    m, c = _comparison(path)
    assert c.items, "no attributable allocations in this fixture"
    assert not c.missing, f"the replay did not report {c.missing}: re-record the fixture or fix the rule"
    assert not c.unknown, f"no rule compares {c.unknown}: add it to memfit.replay.deepspeed.compare.ITEM_RULES"
    assert all(i.measured_pinned_bytes is not None for i in c.items), \
        "fixture predates pinned_bytes: rerun python -m memfit.replay.deepspeed.record_fixtures --overwrite"
    wrong = {f"{i.key}@{i.at}": (i.predicted_bytes, i.measured_bytes, i.predicted_pinned_bytes, i.measured_pinned_bytes)
             for i in c.items if not i.matches}
    known = {item: (plan, replay, 0, 0) for (case, item), (plan, replay) in KNOWN_LEDGER_GAPS.items()
             if case == m.spec.name}
    assert wrong == known, "\n".join(f"{k}: plan {v[0]:,} B ({v[2]:,} pinned) vs replay {v[1]:,} B ({v[3]:,} pinned)"
                                     for k, v in wrong.items())


def test_every_rule_is_exercised_by_some_fixture():
    seen = {i.key for p in ALL for i in _comparison(p)[1].items}
    assert seen == set(ITEM_RULES)


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_pinned_bytes_are_what_deepspeeds_flags_say(path):
    """The pin_memory calls the replay saw, per item, against the flag DeepSpeed's code tests."""
    m, c = _comparison(path)
    off = [f"{i.key}@{i.at}: flag {i.deepspeed_pins}, {i.measured_pinned_bytes:,} of {i.measured_bytes:,} B pinned"
           for i in c.items if not i.flag_agrees]
    assert not off, "\n".join(off)
    offload = any(d.get("pin_memory") for d in (m.deepspeed_config_used["zero_optimization"].get(k) or {}
                                                 for k in ("offload_param", "offload_optimizer")))
    assert any(i.measured_pinned_bytes for i in c.items) == offload


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_pinned_and_pageable_per_phase(path):
    """The plan's pinned bytes (items DeepSpeed pins, by the CUDA placement rules) equal the
    replay's at every phase's end, and at its host peak; the pageable part is the rest of the peak."""
    m, c = _comparison(path)
    for p in c.phases:
        assert p.measured_pinned_end_bytes == p.predicted_pinned_end_bytes, (p.phase, "end")
        if p.phase == "load" and m.spec.zero_init:
            continue  # the peak is reached at another moment (random init, see TOL_ZERO_INIT_LOAD_REL)
        assert p.measured_pinned_bytes == p.predicted_pinned_bytes, (p.phase, "peak")
        assert p.measured_pageable_bytes == p.measured_host_bytes - p.measured_pinned_bytes


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_phase_peaks(path):
    m, c = _comparison(path)
    for p in c.phases:
        label = f"{p.phase}: plan {p.predicted_host_bytes:,} vs replay {p.measured_host_bytes:,} ({p.rel_diff:+.2%})"
        if p.phase == "load" and m.spec.zero_init:
            assert abs(p.rel_diff) <= TOL_ZERO_INIT_LOAD_REL, label
        elif p.phase in INIT_PHASES:
            assert abs(p.diff_bytes) <= TOL_INIT_BYTES, label
        elif p.phase in ("optimizer_step", "step2.optimizer_step"):
            assert abs(p.diff_bytes) <= TOL_STEP_OPT_BYTES, label
        elif p.phase in ("forward", "backward", "accum.forward", "accum.backward", "step2.forward", "step2.backward"):
            assert abs(p.rel_diff) <= TOL_STEP_REL, label
        elif p.phase == "save":
            assert abs(p.rel_diff) <= TOL_SAVE_REL, label
        else:
            raise AssertionError(f"no tolerance for phase {p.phase}")


def test_the_replay_report_shows_pinned_bytes_and_every_compared_item():
    import io
    import json

    from rich.console import Console

    from memfit.render.replay_out import comparison_to_dict, render_comparison

    m, c = _comparison(SEED_FIXTURES[0])
    out = comparison_to_dict(c, m)
    json.dumps(out)
    assert len(out["items"]) == len(c.items) and out["missing_items"] == [] and out["unknown_items"] == []
    frozen = next(i for i in out["items"] if i["key"] == "zero3.ds_tensor.frozen" and i["at"] == "initialize")
    assert frozen["predicted_pinned_bytes"] == frozen["measured_pinned_bytes"] == frozen["measured_bytes"] > 0
    buf = io.StringIO()
    render_comparison(c, m, Console(file=buf, width=200))
    text = buf.getvalue()
    assert "pinned replay" in text and "zero3.ds_tensor.frozen" in text
