"""ZeRO-3's parameter coordinator: memfit's simulation (``memfit.core.ledger.deepspeed.zero3_fetch``) against
DeepSpeed's own, logged at every fetch and release of a real replay.

The fixtures in tests/fixtures/coordinator/ were recorded by ``python -m
memfit.replay.deepspeed.coordinator_log`` (real ``deepspeed.initialize`` + 2 steps on the CPU accelerator,
rank 0 of a fake world; ``MEMFIT_COORDINATOR_LOG`` wraps ``PartitionedParameterCoordinator``): one
LoRA case (W = 2) and one full fine-tuning case with the optimizer and parameters offloaded and
gradient checkpointing (W = 4), both with ``stage3_prefetch_bucket_size``,
``stage3_max_live_parameters``, ``stage3_max_reuse_distance`` and the persistence threshold small
enough to decide something, and the seed's method, prefix tuning on GPT-J (W = 2) with the limits
at 1e9 (step 2 keeps what its backward uses). Pass 1 is step 1 (the trace is recorded), pass 2
step 2 (complete trace: prefetch and reuse).

What is compared:
- driven by the order the real run took, the simulation gives the coordinator's own counters
  (``__n_available_params``, the in-flight registry) and the bytes of gathered params and of the
  coalesced all-gather buffers at every hook, exactly, in pass 2; in pass 1 the bytes exactly, the
  counter not: peft's LoRA layer reads ``lora_A``'s weight in its own forward (and peft's
  ``get_prompt`` the prompt encoder's embedding in the PeftModel's), which DeepSpeed's
  ``ZeROOrderedDict`` gathers outside the coordinator's count the first time and registers as an
  external parameter of the reader, fetched with it from then on (``Coordinator.register``);
- over the order the ledger rebuilds from the parameter names alone (``module_order``), the
  highest bytes of each pass (the ledger's "expected" figure) equal the measured highest;
- the rules' upper bound (``upper_bound_numel``) is above every measured point.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest

from memfit.core.ledger.context import RecipeContext, ceil_div
from memfit.core.ledger.deepspeed.step import _modules, step_layout
from memfit.core.ledger.deepspeed.step_segments import gather_pass
from memfit.core.ledger.deepspeed.zero3_fetch import Coordinator, GParam, persistent_flags, upper_bound_numel
from memfit.replay.compare import scenario_of
from memfit.replay.measurement import load_fixture

DIR = Path(__file__).resolve().parents[1] / "fixtures" / "coordinator"
CASES = sorted(Path(p).name[: -len(".log.json")] for p in glob.glob(str(DIR / "*.log.json")))


def _load(case: str):
    log = json.loads((DIR / f"{case}.log.json").read_text())
    m = load_fixture(str(DIR / f"{case}.measurement.json"))
    assert m.ok, m.error
    return log, m


def _limits(m):
    z = m.deepspeed_config_used["zero_optimization"]
    return dict(prefetch_bucket_size=int(z["stage3_prefetch_bucket_size"]),
                max_live_parameters=int(z["stage3_max_live_parameters"]),
                max_reuse_distance=int(z["stage3_max_reuse_distance"]))


def test_fixtures_exercise_the_rules():
    assert len(CASES) >= 2
    for case in CASES:
        log, m = _load(case)
        recs = log["records"]
        assert {r["pass"] for r in recs} == {1, 2}
        assert any(r["flat_bytes"] for r in recs), "no coalesced all-gather in flight"
        p2 = [r for r in recs if r["pass"] == 2]
        # prefetch and reuse: step 2 holds more than step 1 at its highest
        assert max(r["gathered_bytes"] + r["flat_bytes"] for r in p2) > max(
            r["gathered_bytes"] + r["flat_bytes"] for r in recs if r["pass"] == 1)


@pytest.mark.parametrize("case", CASES)
def test_simulation_over_the_real_order_matches_every_hook(case):
    log, m = _load(case)
    mods, ext = log["modules"], log.get("externals", {})
    names = list(mods)
    index, params, own = {}, [], []
    for n in names:
        ps = []
        for pname, numel, persist, eb in mods[n]:
            index[pname] = len(params)
            params.append(GParam(numel, eb, persist))
            ps.append(index[pname])
        own.append(ps)
    externals = [[index[x] for x in ext.get(n, [])] for n in names]
    mid = {n: i for i, n in enumerate(names)}
    recs = log["records"]
    recorded = [mid[r["module"]] for r in recs if r["pass"] == 1 and r["kind"] == "fetch"]
    for pass_no, complete in ((1, False), (2, True)):
        co = Coordinator(params, own, m.spec.world_size, offload_param=False, externals=externals,
                         order=recorded if complete else None, persistent_available=complete, **_limits(m))
        for r in (r for r in recs if r["pass"] == pass_no):
            (co.fetch if r["kind"] == "fetch" else co.release)(mid[r["module"]])
            where = f"pass {pass_no}, {r['kind']} {r['module']}"
            assert (co.gathered_bytes, co.flat_bytes) == (r["gathered_bytes"], r["flat_bytes"]), where
            if complete:
                inflight = sum(params[q].numel for q in co.registry)
                assert (co.n_available, inflight) == (r["n_available"], r["inflight_numel"]), where


def _ledger_pass(m, complete: bool):
    ctx = RecipeContext.from_scenario(scenario_of(m))
    z = ctx.scenario.deepspeed.zero
    numels = [p.numel for p in ctx.params]
    flags = persistent_flags(numels, z.param_persistence_threshold, z.model_persistence_threshold)
    gparams = [GParam(n, ctx.model_bytes, f) for n, f in zip(numels, flags)]
    layout = step_layout(ctx)
    # the CPU accelerator: .to(device) of an offloaded partition is the partition itself
    gp = gather_pass(layout, gparams, ctx.world, offload_param=False, allgather_sequential=False, complete=complete,
                     persistent_available=complete, **_limits(m))
    return ctx, layout, gparams, gp


@pytest.mark.parametrize("case", CASES)
def test_ledger_expected_figure_from_the_names_alone(case):
    log, m = _load(case)
    for pass_no, complete in ((1, False), (2, True)):
        _, _, _, gp = _ledger_pass(m, complete)
        measured = max(r["gathered_bytes"] + r["flat_bytes"] for r in log["records"] if r["pass"] == pass_no)
        print(f"\n{case} pass {pass_no}: expected {gp.max_bytes:,} B, measured {measured:,} B")
        assert gp.max_bytes == measured


@pytest.mark.parametrize("case", CASES)
def test_upper_bound_holds_at_every_hook(case):
    log, m = _load(case)
    ctx, layout, gparams, _ = _ledger_pass(m, True)
    W = ctx.world
    lim = _limits(m)
    aligned = sum(ceil_div(g.numel, W) * W for g in gparams if not g.persist)
    bound = upper_bound_numel(chain_numel=layout.order.chain_max, largest_module=max(_modules(ctx).values()),
                              largest_param=max(g.numel for g in gparams), total_numel=aligned, **lim)
    worst = max(r["gathered_bytes"] + r["flat_bytes"] for r in log["records"])
    print(f"\n{case}: bound {bound * ctx.model_bytes:,} B, highest measured {worst:,} B")
    assert worst <= bound * ctx.model_bytes


@pytest.mark.slow
@pytest.mark.usefixtures("ds_ops_built")  # its LoRA case loads fused_adam: never built inside the replay's deadline
def test_a_fresh_replay_logs_the_same(tmp_path):
    """The fixtures are what the replay logs today (deterministic: sizes, not timings)."""
    from memfit.replay.deepspeed.coordinator_log import record

    case = CASES[0]
    record(str(tmp_path), only=[case])
    fresh = json.loads((tmp_path / f"{case}.log.json").read_text())
    assert fresh == json.loads((DIR / f"{case}.log.json").read_text())


@pytest.mark.parametrize("case", CASES)
def test_module_order_from_names_is_the_real_fetch_order(case):
    """The modules that own parameters are fetched in the order the ledger rebuilds from the
    names (module_order), forward and backward, exactly: in the backward only the modules whose
    output needs a gradient (LoRA on q and v: not the first block's input norm nor its frozen k
    projection, which see only the frozen embeddings' output; ``module_order._grad_flow``)."""
    from memfit.core.ledger.deepspeed.step_segments import record_order

    log, m = _load(case)
    ctx, layout, _, _ = _ledger_pass(m, False)
    names = layout.order.names
    ours = [names[i] for i in record_order(layout) if layout.order.params[i]]
    real = [r["module"] for r in log["records"]
            if r["pass"] == 1 and r["kind"] == "fetch" and log["modules"].get(r["module"])]
    assert ours == real
