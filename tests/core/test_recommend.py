"""memfit recommend: the fast estimator against the exact ledger, the search space, the patched
DeepSpeed JSON read back by memfit's parser, the script diff, and the three example scenarios.

The fast estimator (``memfit.core.recommend.deepspeed.estimate``) must give the exact ledger's per-phase
peaks (``make_plan`` on the candidate's scenario, built from the patched JSON through
``build_scenario``): GPU per rank, host per process, host per node and NVMe per rank. The stated tolerance is
0 bytes: the estimator replays the same recipes on aggregates, so any difference is a bug.
"""

import dataclasses
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES, SEED

from memfit.core.dsconfig import AutoContext, load_deepspeed_config
from memfit.core.plan import make_plan
from memfit.core.recommend import recommend
from memfit.core.recommend.deepspeed.estimate import estimate_peaks, phase_names
from memfit.core.recommend.files import write_recommendations
from memfit.core.recommend.patch import (
    candidate_inputs,
    claimed_mismatches,
    count_changes,
    describe_changes,
    patch_deepspeed_json,
)
from memfit.core.recommend.deepspeed.search import prepare
from memfit.core.recommend.deepspeed.space import enumerate_candidates
from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.inputs import ScenarioInputs
from memfit.core.scenario.read import read_scenario_file
from memfit.errors import MemfitError

DS = EXAMPLES / "deepspeed"
LLAMA2_LORA = EXAMPLES / "llama2-7b-lora-1x24gb.yaml"
LLAMA3_FULL = EXAMPLES / "llama3-70b-full-8x80gb.yaml"
TOLERANCE_BYTES = 0
"""Fast vs exact, per phase and per peak: equal (see the module docstring)."""

FP32_ZERO1 = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
              "zero_optimization": {"stage": 1}, "optimizer": {"type": "Lion", "params": {"lr": 1e-4}}}

GRID = {
    "seed-0.5": lambda: read_scenario_file(SEED),
    "seed-0.19-nvme": lambda: dataclasses.replace(read_scenario_file(SEED), ds_version="0.19", nvme="1TB"),
    "llama2-lora-trainer": lambda: read_scenario_file(LLAMA2_LORA),
    "llama3-70b-full": lambda: read_scenario_file(LLAMA3_FULL),
    "gpt2-lora-bias-zero2-bf16": lambda: ScenarioInputs(
        model="gpt2", peft_method="lora", peft_options={"lora_bias": "all"}, deepspeed=str(DS / "zero2_bf16.json"),
        gpus="2xa100-80gb", seq_len=256),
    "llama3-8b-full-nvme-0.6": lambda: ScenarioInputs(
        model="meta-llama/Meta-Llama-3-8B", deepspeed=str(DS / "zero3_nvme_offload.json"), gpus="4xa100-40gb",
        nvme="2TB", seq_len=256, ds_version="0.6"),
    "t0-prompt-default-config-v100": lambda: ScenarioInputs(model="bigscience/T0_3B", peft_method="prompt",
                                                            gpus="2xv100-32gb", seq_len=256),
    "opt-prefix-0.6-3gpus": lambda: ScenarioInputs(
        model="facebook/opt-1.3b", peft_method="prefix", deepspeed=str(DS / "seed_kogpt_zero3_offload.json"),
        gpus="3xrtx3090", seq_len=256, ds_version="0.6"),
    "bloom-freeze-2nodes": lambda: ScenarioInputs(
        model="bigscience/bloom-7b1", peft_method="freeze", peft_options={"freeze_patterns": "*h.1*,*h.2*"},
        deepspeed=str(DS / "zero2_bf16.json"), gpus="4xa100-80gb", nodes=2, seq_len=256),
    "gpt2-medium-fp32-lion": lambda: ScenarioInputs(model="gpt2-medium", deepspeed_inline=FP32_ZERO1,
                                                    gpus="2xrtx3090", seq_len=256),
    # an encoder-decoder with its own target length, a 256k vocabulary (the loss's tensors dominate the
    # step), layers that differ (sliding and full attention)
    "flan-t5-target-len-lora": lambda: ScenarioInputs(model="google/flan-t5-large", peft_method="lora",
                                                      deepspeed=str(DS / "zero2_bf16.json"), gpus="2xa100-40gb",
                                                      seq_len=512, target_len=64),
    "gemma2-2b-full-256k-vocab": lambda: ScenarioInputs(model="google/gemma-2-2b", deepspeed=str(DS / "zero2_bf16.json"),
                                                        gpus="2xa100-80gb", seq_len=1024),
    "gemma3-1b-lora-mixed-layers": lambda: ScenarioInputs(model="gemma-3-1b", peft_method="lora",
                                                          gpus="1xrtx4090", seq_len=2048),
    # DeepSpeed 0.6 optimizes frozen params passed to it (model_parameters=all) but autograd gives them
    # no gradient; ZeRO-2's rank-0 partition then holds no param with one (the fuzz test's seed 1362)
    "gpt2-prompt-all-params-ds06-ga2": lambda: ScenarioInputs(
        model="gpt2", peft_method="prompt", peft_options={"num_virtual_tokens": 4}, model_parameters="all",
        deepspeed_inline={"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
                          "zero_optimization": {"stage": 2}, "fp16": {"enabled": True}},
        gpus="2xa100-80gb", seq_len=256, ds_version="0.6"),
}


def _sample(prep, per_stratum: int, seed: int, *, fine: bool = False):
    """Candidates stratified over what changes the recipes taken (stage, offloads, zero.Init; with
    ``fine`` also pinning and precision), a few random ones per stratum, other settings random."""
    strata: dict[tuple, list] = {}
    for c in enumerate_candidates(prep.space, allowed=lambda s, o, p, pr: prep.valid[(s, pr)]):
        key = (c.stage, c.offload_optimizer, c.offload_param, c.zero_init)
        if fine:
            key += (c.pin_optimizer, c.pin_param, c.precision)
        strata.setdefault(key, []).append(c)
    rng = random.Random(seed)
    return [c for group in strata.values() for c in rng.sample(group, min(per_stratum, len(group)))]


def _max_diff(inputs, candidates, prep) -> tuple[int, int]:
    worst = 0
    for c in candidates:
        patched, _ = patch_deepspeed_json(prep.raw_json, prep.scenario, prep.base, c)
        sc = build_scenario(candidate_inputs(inputs, patched, c))
        assert claimed_mismatches(sc, c) == []
        plan = make_plan(sc)
        assert [p.name for p in plan.phases] == list(phase_names(c))
        for (g, h, node, nvme), ph in zip(estimate_peaks(prep.aggregates, c), plan.phases):
            d = max(abs(g - ph.gpu_peak_bytes), abs(h - ph.cpu_peak_bytes), abs(node - ph.node_cpu_peak_bytes),
                    abs(nvme - ph.nvme_bytes))
            assert d <= TOLERANCE_BYTES, (ph.name, c, g - ph.gpu_peak_bytes, h - ph.cpu_peak_bytes,
                                          node - ph.node_cpu_peak_bytes, nvme - ph.nvme_bytes)
            worst = max(worst, d)
    return worst, len(candidates)


@pytest.mark.parametrize("name", sorted(GRID))
def test_fast_estimate_equals_exact_ledger(name):
    inputs = GRID[name]()
    prep = prepare(inputs)
    worst, n = _max_diff(inputs, _sample(prep, 1, seed=sum(map(ord, name))), prep)
    print(f"\n{name}: {n} candidates, max |fast - exact| = {worst} B (tolerance {TOLERANCE_BYTES} B)")
    assert n >= 4


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(GRID))
def test_fast_estimate_equals_exact_ledger_wide(name):
    inputs = GRID[name]()
    prep = prepare(inputs)
    worst, n = _max_diff(inputs, _sample(prep, 3, seed=7, fine=True), prep)
    print(f"\n{name}: {n} candidates, max |fast - exact| = {worst} B")


# ---- the search space ---------------------------------------------------------------------


def test_space_keeps_the_global_batch_and_pins_irrelevant_settings():
    prep = prepare(read_scenario_file(LLAMA3_FULL))
    b = prep.base
    W = prep.scenario.world_size
    seen_micro = set()
    for c in enumerate_candidates(prep.space):
        assert c.micro_batch * c.grad_accum * W == b.micro_batch * b.grad_accum * W
        seen_micro.add(c.micro_batch)
        if c.stage < 3:
            assert c.offload_param == "none" and not c.zero_init
            assert (c.prefetch_bucket_size, c.max_live_parameters, c.param_persistence_threshold) == (
                b.prefetch_bucket_size, b.max_live_parameters, b.param_persistence_threshold)
        if c.stage == 0:
            assert c.offload_optimizer == "none" and c.reduce_bucket_size == b.reduce_bucket_size
        assert "nvme" not in (c.offload_optimizer, c.offload_param)  # the scenario gives no NVMe
        if c.precision == "fp32":
            assert c.load_dtype == "fp32"
    assert seen_micro == {1, 2, 4, 8, 16}


def test_nvme_only_with_nvme_space_and_bf16_only_where_the_card_has_it():
    with_nvme = prepare(dataclasses.replace(read_scenario_file(SEED), nvme="2TB"))
    assert "nvme" in with_nvme.space.offload_devices
    t4 = prepare(ScenarioInputs(model="gpt2", gpus="2xt4", seq_len=128))
    assert "bf16" not in t4.space.precisions
    assert not any(c.precision == "bf16" for c in enumerate_candidates(t4.space))


def test_count_changes_matches_the_described_changes():
    prep = prepare(read_scenario_file(SEED))
    rng = random.Random(3)
    cands = list(enumerate_candidates(prep.space))
    for c in rng.sample(cands, 300):
        assert count_changes(prep.base, c) == len(describe_changes(prep.base, c))


# ---- patching -----------------------------------------------------------------------------


def test_the_users_own_configuration_patches_to_the_same_json():
    for path in (SEED, LLAMA2_LORA, LLAMA3_FULL):
        prep = prepare(read_scenario_file(path))
        patched, notes = patch_deepspeed_json(prep.raw_json, prep.scenario, prep.base, prep.base)
        assert patched == prep.raw_json and notes == ()
        assert describe_changes(prep.base, prep.base) == ()


def test_auto_is_kept_where_its_value_is_still_right():
    inputs = read_scenario_file(LLAMA2_LORA)
    prep = prepare(inputs)
    c = dataclasses.replace(prep.base, micro_batch=1, grad_accum=4, precision="fp16", stage=3, offload_optimizer="cpu")
    patched, notes = patch_deepspeed_json(prep.raw_json, prep.scenario, prep.base, c)
    assert patched["train_micro_batch_size_per_gpu"] == "auto"  # the Trainer fills it
    assert patched["train_batch_size"] == "auto"
    assert patched["optimizer"]["params"] == {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}
    assert patched["zero_optimization"]["reduce_bucket_size"] == "auto"  # unchanged: h*h either way
    # the Trainer fills these from gradient_accumulation_steps and --fp16, which the recommendation sets
    # (issue 23 item 6: writing 4 here contradicted the Trainer's own accumulation)
    assert patched["gradient_accumulation_steps"] == "auto"
    assert patched["fp16"]["enabled"] == "auto" and patched["bf16"]["enabled"] == "auto"
    ci = candidate_inputs(inputs, patched, c)
    assert (ci.grad_accum, ci.precision, ci.micro_batch) == (4, "fp16", 1)
    sc = build_scenario(ci)
    assert claimed_mismatches(sc, c) == []


def test_nvme_offload_gets_a_placeholder_path_and_a_note():
    inputs = dataclasses.replace(read_scenario_file(SEED), nvme="2TB")
    prep = prepare(inputs)
    c = dataclasses.replace(prep.base, offload_optimizer="nvme", offload_param="nvme")
    patched, notes = patch_deepspeed_json(prep.raw_json, prep.scenario, prep.base, c)
    zo = patched["zero_optimization"]
    assert zo["offload_optimizer"]["device"] == "nvme" and zo["offload_optimizer"]["nvme_path"]
    assert any("nvme_path" in n for n in notes)
    assert claimed_mismatches(build_scenario(candidate_inputs(inputs, patched, c)), c) == []


# ---- the three scenarios ------------------------------------------------------------------

SCENARIOS = {"seed": SEED, "llama2-7b-lora-1x24gb": LLAMA2_LORA, "llama3-70b-full-8x80gb": LLAMA3_FULL}


@pytest.fixture(scope="module")
def results():
    return {name: recommend(read_scenario_file(path), top=3) for name, path in SCENARIOS.items()}


def _flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


CHANGEABLE = ("zero_optimization.stage", "zero_optimization.offload_optimizer.", "zero_optimization.offload_param.",
              "zero_optimization.reduce_bucket_size", "zero_optimization.stage3_", "fp16.enabled", "bf16.enabled",
              "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_recommendations_fit_per_the_exact_ledger_and_are_ranked(results, name):
    from memfit.core.recommend.confirm import risk_ratio
    from memfit.core.verdict import gpu_figure, host_figure

    r = results[name]
    assert r.recommendations, r.notes
    assert r.max_fast_exact_diff_bytes <= TOLERANCE_BYTES
    # ranked as the verdict judges them: those that fit with memfit's measured margin first, fastest
    # first; then those at risk, least at risk first (core/recommend/confirm.py:rank_by_level)
    levels = [rec.plan.verdict.level for rec in r.recommendations]
    assert levels == sorted(levels, key=lambda lv: lv != "fits") and "does_not_fit" not in levels
    times = [rec.step_time.total_s for rec in r.recommendations if rec.plan.verdict.level == "fits"]
    assert times == sorted(times)
    risky = [rec for rec in r.recommendations if rec.plan.verdict.level == "at_risk"]
    ratios = [risk_ratio(max(gpu_figure(p) for p in rec.plan.phases), max(host_figure(p) for p in rec.plan.phases),
                         r.hardware) for rec in risky]
    assert ratios == sorted(ratios)
    for rec in r.recommendations:
        assert rec.plan.verdict.fits
        for ph in rec.plan.phases:
            assert ph.gpu_peak_bytes <= r.gpu_limit_bytes and ph.node_cpu_peak_bytes <= r.host_limit_bytes
        # the plan is the candidate's: rebuilt from its own inputs it is the same
        again = make_plan(build_scenario(rec.scenario_inputs))
        assert [p.gpu_peak_bytes for p in again.phases] == [p.gpu_peak_bytes for p in rec.plan.phases]
        assert rec.changes, "a configuration that already fits with headroom needs no recommendation"


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_written_files_read_back_with_the_claimed_settings(results, name, tmp_path):
    r = write_recommendations(results[name], tmp_path / "out")
    user = read_scenario_file(SCENARIOS[name])
    original = json.loads(Path(user.deepspeed).read_text())
    for rec in r.recommendations:
        yaml_file = next(Path(f) for f in rec.files if f.endswith("scenario.yaml"))
        json_file = Path(read_scenario_file(yaml_file).deepspeed)  # written beside it, or the user's when unchanged
        assert (json_file.parent == yaml_file.parent) == any(f.endswith(".json") for f in rec.files)
        written = json.loads(json_file.read_text())
        # memfit's parser reads the JSON (as the Trainer would fill "auto") and the scenario file back
        auto = {k for k, v in _flatten(written).items() if v == "auto"}

        def fill(key, value, auto=auto):
            return value if key in auto else None

        ds, _ = load_deepspeed_config(json_file, context=AutoContext(
            world_size=r.hardware.world_size, micro_batch_size=rec.candidate.micro_batch,
            # the Trainer's gradient_accumulation_steps, the written scenario's, fills an "auto"
            gradient_accumulation_steps=fill("gradient_accumulation_steps", read_scenario_file(yaml_file).grad_accum or 1),
            precision=rec.candidate.precision if auto & {"fp16.enabled", "bf16.enabled"} else None,
            hidden_size=build_scenario(user).model.arch.hidden_size, learning_rate=fill("optimizer.params.lr", 1e-5),
            adam_betas=fill("optimizer.params.betas", (0.9, 0.999)), adam_epsilon=fill("optimizer.params.eps", 1e-8),
            weight_decay=fill("optimizer.params.weight_decay", 0.0), max_grad_norm=fill("gradient_clipping", 1.0)))
        assert (ds.zero.stage, ds.precision, ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps) == (
            rec.candidate.stage, rec.candidate.precision, rec.candidate.micro_batch, rec.candidate.grad_accum)
        sc = build_scenario(read_scenario_file(yaml_file))
        assert claimed_mismatches(sc, rec.candidate) == []
        assert [p.node_cpu_peak_bytes for p in make_plan(sc).phases] == [p.node_cpu_peak_bytes for p in rec.plan.phases]
        # only the keys the change needs are different; everything else as the user wrote it
        a, b = _flatten(original), _flatten(written)
        for key in set(a) | set(b):
            if a.get(key) != b.get(key):
                assert key.startswith(CHANGEABLE), key
        assert {k for k, v in a.items() if v == "auto"} - {k for k, v in b.items() if v == "auto"} <= {
            k for k in a if k.startswith(CHANGEABLE)}
        if rec.candidate.zero_init and not user.zero_init:
            diff = next(Path(f) for f in rec.files if f.endswith("train.py.diff")).read_text()
            assert "HfDeepSpeedConfig" in diff and "+dschf = HfDeepSpeedConfig(ds_config)" in diff


def test_nothing_the_user_has_is_overwritten(results, tmp_path):
    r = results["seed"]
    user_json = Path(read_scenario_file(SEED).deepspeed)
    before = user_json.read_bytes()
    out = tmp_path / "out"
    first = write_recommendations(r, out)
    mine = Path(first.recommendations[0].files[0])  # in the folder of configuration 1
    mine.write_text("mine")
    with pytest.raises(MemfitError, match="never overwrites"):
        write_recommendations(r, out)
    assert mine.read_text() == "mine"
    assert user_json.read_bytes() == before
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(MemfitError, match="not a directory"):
        write_recommendations(r, blocker)


def test_llama3_70b_needs_zero_init_and_says_so(results):
    r = results["llama3-70b-full-8x80gb"]
    assert not r.baseline.verdict.fits
    for rec in r.recommendations:
        assert rec.candidate.zero_init  # every rank loading 70B params in host RAM cannot fit
        assert "HfDeepSpeedConfig(ds_config)" in rec.script_diff


def test_a_configuration_that_fits_is_offered_unchanged():
    inputs = ScenarioInputs(model="gpt2", gpus="1xa100-80gb", seq_len=512, micro_batch=4, load_dtype="bf16")
    r = recommend(inputs, top=5)
    assert r.baseline_fits_with_headroom
    same = [rec for rec in r.recommendations if not rec.changes]
    assert len(same) == 1 and same[0].script_diff == "" and same[0].notes == ()
    assert same[0].deepspeed_json == build_scenario(inputs).deepspeed_json  # memfit's default config, as is
    assert same[0].rank == 1  # on one GPU nothing is faster than the plain run


def test_nothing_fits_says_what_to_try():
    r = recommend(ScenarioInputs(model="meta-llama/Meta-Llama-3-70B", gpus="1xrtx3090", cpu_ram="32GB",
                                 seq_len=512), top=2)
    assert r.recommendations == () and any("no configuration" in n for n in r.notes)


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(MemfitError, match="headroom"):
        recommend(read_scenario_file(SEED), headroom=1.5)
    with pytest.raises(MemfitError, match="top"):
        recommend(read_scenario_file(SEED), top=0)
    with pytest.raises(MemfitError, match="cuda"):
        recommend(dataclasses.replace(read_scenario_file(SEED), accelerator="cpu"))


def test_progress_is_reported_to_the_end():
    calls = []
    recommend(read_scenario_file(SEED), top=1, progress=lambda done, total: calls.append((done, total)))
    assert calls and calls[-1][0] == calls[-1][1] > 1000


DEEPSPEED_READER = """
import importlib, json, os, sys
os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch.distributed as tdist
from torch.testing._internal.distributed.fake_pg import FakeStore
import deepspeed.comm as dist
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # never used by the config
from deepspeed.runtime.config import DeepSpeedConfig
cases = json.loads(sys.stdin.read())
tdist.init_process_group("fake", store=FakeStore(), rank=0, world_size=cases[0]["world_size"])
dist.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
out = []
for case in cases:
    if tdist.get_world_size() != case["world_size"]:
        tdist.destroy_process_group()
        tdist.init_process_group("fake", store=FakeStore(), rank=0, world_size=case["world_size"])
    c = DeepSpeedConfig(case["config"])
    z = c.zero_config
    dev = lambda s: str(getattr(s.device, "value", s.device)) if s is not None else "none"
    out.append({"stage": int(z.stage), "offload_optimizer": dev(z.offload_optimizer), "offload_param": dev(z.offload_param),
                "precision": "fp16" if c.float16_config.enabled else "bf16" if c.bfloat16_config.enabled else "fp32",
                "micro_batch": c.train_micro_batch_size_per_gpu, "grad_accum": c.gradient_accumulation_steps,
                "reduce_bucket_size": int(z.reduce_bucket_size), "prefetch_bucket_size": int(z.prefetch_bucket_size),
                "max_live_parameters": int(z.max_live_parameters),
                "param_persistence_threshold": int(z.param_persistence_threshold)})
print(json.dumps(out))
"""


@pytest.mark.slow
def test_deepspeed_itself_reads_the_recommended_configs(results):
    """DeepSpeed 0.19.8's ``DeepSpeedConfig`` (CPU accelerator, a fake process group of the
    scenario's world size) reads every recommended JSON, "auto" filled as the Trainer fills it, with
    the settings the recommendation claims. In a child process: the core suite stays torch-free."""
    pytest.importorskip("deepspeed")
    cases, claims = [], []
    for r in results.values():
        for rec in r.recommendations:
            sc = build_scenario(rec.scenario_inputs)
            cases.append({"world_size": sc.world_size, "config": sc.deepspeed_json})
            claims.append(rec.candidate)
    p = subprocess.run([sys.executable, "-c", DEEPSPEED_READER], input=json.dumps(cases), capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    for got, c in zip(json.loads(p.stdout.strip().splitlines()[-1]), claims):
        want = {"stage": c.stage, "precision": c.precision, "micro_batch": c.micro_batch, "grad_accum": c.grad_accum}
        if c.stage >= 1:
            want |= {"offload_optimizer": c.offload_optimizer, "reduce_bucket_size": c.reduce_bucket_size}
        if c.stage == 3:
            want |= {"offload_param": c.offload_param, "prefetch_bucket_size": c.prefetch_bucket_size,
                     "max_live_parameters": c.max_live_parameters,
                     "param_persistence_threshold": c.param_persistence_threshold}
        assert {k: got[k] for k in want} == want


def test_recommend_imports_no_torch():
    code = ("import sys; from memfit.core.scenario.read import read_scenario_file; "
            "from memfit.core.recommend import recommend; "
            f"recommend(read_scenario_file({str(SEED)!r}), top=1); "
            "assert not any(m in sys.modules for m in ('torch', 'deepspeed', 'transformers', 'peft')), 'heavy import'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_prefix_tuning_is_never_offered_gradient_checkpointing():
    """transformers drops peft's prefix (past_key_values) under checkpointing: not a valid fix."""
    import dataclasses

    from memfit.core.recommend import recommend
    from memfit.core.scenario.read import read_scenario_file

    from conftest import SEED

    res = recommend(dataclasses.replace(read_scenario_file(SEED), ds_version="0.19"), top=5)
    assert res.recommendations
    assert not any(r.candidate.gradient_checkpointing for r in res.recommendations)


# ---- outside DeepSpeed: the framework, precision, optimizer, quantization and FSDP axes -----------

TORCH_GRID = {
    "qlora-example": lambda: read_scenario_file(EXAMPLES / "frameworks" / "qlora-llama3-8b-1x24gb.yaml"),
    "ddp-example": lambda: read_scenario_file(EXAMPLES / "frameworks" / "ddp-lora-llama2-7b-2gpu.yaml"),
    "fsdp2-offload-example": lambda: read_scenario_file(EXAMPLES / "frameworks" / "fsdp2-offload-llama3-8b-8gpu.yaml"),
    "gpt2-full-fp32-2gpus": lambda: ScenarioInputs(model="gpt2", framework="ddp", precision="fp32", gpus="2xa100-40gb",
                                                   seq_len=256, micro_batch=4),
    "opt-lora-fsdp1-t4": lambda: ScenarioInputs(model="facebook/opt-1.3b", peft_method="lora", framework="fsdp",
                                                precision="amp_fp16", gpus="4xt4", seq_len=256, micro_batch=2,
                                                fsdp={"sharding_strategy": "FULL_SHARD"}),
}


@pytest.mark.parametrize("name", sorted(TORCH_GRID))
def test_torch_fast_estimate_equals_exact_ledger(name):
    """Every phase's peaks of the fast path (the recipes on a LeanTimeline, the model state shared
    between candidates) equal ``make_plan`` on the candidate's scenario rebuilt from its inputs
    (``build_scenario``), to the byte, over a random sample of the search space."""
    from memfit.core.frameworks.resolve import apply_input_files
    from memfit.core.recommend.pytorch.search import _base, candidate_inputs, enumerate_candidates, fast_peaks

    inputs = apply_input_files(TORCH_GRID[name]())
    sc = build_scenario(inputs)
    cands = list(enumerate_candidates(sc, _base(sc, inputs)))
    sample = random.Random(sum(map(ord, name))).sample(cands, min(12, len(cands)))
    cache: dict = {}
    checked = 0
    for c in sample:
        peaks = fast_peaks(inputs, sc, c, cache)
        try:
            plan = make_plan(build_scenario(candidate_inputs(inputs, sc, c)))
        except MemfitError:
            assert peaks is None, c  # both paths refuse the same configurations
            continue
        assert peaks is not None, c
        exact = tuple((p.gpu_peak_bytes, p.cpu_peak_bytes, p.node_cpu_peak_bytes, p.nvme_bytes) for p in plan.phases)
        assert peaks == exact, (c, [(p.name, a, b) for p, a, b in zip(plan.phases, peaks, exact) if a != b])
        checked += 1
    print(f"\n{name}: {checked} candidates, fast == exact")
    assert checked >= 6


def test_torch_recommend_searches_the_new_axes_and_confirms():
    r = recommend(read_scenario_file(EXAMPLES / "frameworks" / "ddp-lora-llama2-7b-2gpu.yaml"), top=5)
    assert r.recommendations and r.max_fast_exact_diff_bytes == 0
    searched = set()
    from memfit.core.frameworks.resolve import apply_input_files
    from memfit.core.recommend.pytorch.search import _base, enumerate_candidates

    inputs = apply_input_files(read_scenario_file(EXAMPLES / "frameworks" / "ddp-lora-llama2-7b-2gpu.yaml"))
    sc = build_scenario(inputs)
    for c in enumerate_candidates(sc, _base(sc, inputs)):
        searched.update({("framework", c.framework), ("precision", c.precision), ("optim", c.optim),
                         ("quantization", c.quantization), ("strategy", c.sharding_strategy)})
    assert {("framework", "ddp"), ("framework", "fsdp2"), ("precision", "bf16"), ("optim", "paged_adamw_8bit"),
            ("optim", "adafactor"), ("quantization", "4bit"), ("strategy", "SHARD_GRAD_OP")} <= searched
    for rec in r.recommendations:
        assert rec.plan.verdict.fits


def test_torch_recommendations_are_written_as_scenarios(tmp_path):
    r = write_recommendations(recommend(read_scenario_file(EXAMPLES / "frameworks" / "lora-ampbf16-llama2-7b-1gpu.yaml"),
                                        top=2), tmp_path / "out")
    for rec in r.recommendations:
        yaml_file = next(f for f in rec.files if f.endswith("scenario.yaml"))
        sc = build_scenario(read_scenario_file(yaml_file))
        assert [p.gpu_peak_bytes for p in make_plan(sc).phases] == [p.gpu_peak_bytes for p in rec.plan.phases]
