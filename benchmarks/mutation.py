"""Mutation score: does the test suite catch small deliberate bugs, by comparison with something real?

    python benchmarks/mutation.py                 # every mutation, prints the kill rate and the survivors
    python benchmarks/mutation.py --only ID ...   # some of them
    python benchmarks/mutation.py --list          # the mutations and the tests each runs

Each mutation is one textual change (``find`` -> ``replace``, which must occur exactly once) to the
ledger, the activation model, the PEFT accounting or the DeepSpeed config reading. The script copies
the source tree (src/, tests/, examples/, scripts/, docs/, pyproject.toml) to a temporary directory
once, and for each mutation edits the copy, runs the tests named for it there
(``PYTHONPATH=<copy>/src``, ``pytest -x``, with a timeout), and puts the file back. The checkout is
never modified.

A mutation is *killed* when its tests fail (or time out: reported apart), *survives* when they
pass. The tests chosen for each are comparisons with something measured or built by the real
library: replay fixtures (real DeepSpeed runs), fake-tensor traces (equal to real CPU tensors),
peft's and transformers' own models, DeepSpeed's own config classes and functions. Never the
recommender's fast estimator against the ledger (a self-comparison) nor hard-coded golden numbers.

``ALLOCATOR_MUTATIONS`` is the list to extend once the CUDA caching / pinned host allocator
simulators (src/memfit/core/alloc/) are on main: same format, with the tests that compare them
with recorded allocator traces.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COPY = ("src", "tests", "examples", "scripts", "docs", "pyproject.toml", "README.md")
TIMEOUT_S = 600

# Test selections (paths relative to the repository root, optional "-k" expressions).
PLAN_VS_REPLAY = ("tests/replay/test_plan_vs_replay.py",)
"""Every replay fixture (real DeepSpeed 0.19.8 runs) against the re-planned ledger: items and their
pinned bytes to the byte, pinned/pageable per phase, phase peaks (fast: JSON only)."""
REPLAY_STEP = ("tests/replay/test_activations_vs_replay.py",)
"""The replays' forward/backward against CPU-kernel traces of the same step (a few seconds)."""
SUB_GROUPS = ("tests/replay/test_sub_groups_vs_deepspeed.py",)
ANALYTIC_VS_TRACE = ("tests/trace/test_activations_vs_trace.py", "tests/trace/test_seed_trace_fixture.py")
"""The analytic activation model against fake-tensor traces of the real model code (0.5%)."""
PEFT_LIBRARY = ("tests/exact/test_peft_against_library.py",)
"""memfit's PEFT accounting against the models peft and transformers really build."""
DS_CONFIG = ("tests/exact/test_dsconfig_against_deepspeed.py",)
"""Config reading against DeepSpeed's own config classes and transformers' Trainer "auto" filling."""


@dataclass(frozen=True, slots=True)
class Mutation:
    id: str
    area: str
    path: str
    find: str
    replace: str
    tests: tuple[str, ...]
    why: str
    """The bug it stands for, and the measured comparison expected to catch it."""


L, Z3, Z12, ST = ("src/memfit/core/ledger/load.py", "src/memfit/core/ledger/zero3.py",
                  "src/memfit/core/ledger/zero012.py", "src/memfit/core/ledger/step.py")
ACT, PEFT, DSC, DSS = ("src/memfit/core/activations.py", "src/memfit/core/peft.py", "src/memfit/core/dsconfig.py",
                       "src/memfit/core/ds_settings.py")

MUTATIONS: tuple[Mutation, ...] = (
    # ---- the ledger (deterministic DeepSpeed allocations) -------------------------------------------
    Mutation("ds-buffer-plus-one", "ledger", Z3, "t.alloc(IPG, z.reduce_bucket_size * ctx.comm_bytes)",
             "t.alloc(IPG, (z.reduce_bucket_size + 1) * ctx.comm_bytes)", PLAN_VS_REPLAY,
             "one DeepSpeed buffer +1 element: the reduce bucket read off stage3.ipg_buckets"),
    Mutation("pinned-flag-flipped", "ledger", Z3, "opt_pin = off_opt and z.offload_optimizer.pin_memory",
             "opt_pin = off_opt and not z.offload_optimizer.pin_memory", PLAN_VS_REPLAY,
             "a pinned flag flipped: the gradient buffers booked pageable; the replay saw them pass pin_memory"),
    Mutation("param-partitions-unpinned", "ledger", Z3, 'pinned = off != "none" and z.offload_param.pin_memory',
             'pinned = off != "none" and not z.offload_param.pin_memory', PLAN_VS_REPLAY,
             "offload_param's pin flag ignored for the parameter partitions"),
    Mutation("staging-copy-dropped-step", "ledger", ST, "        t.alloc(STEP_TMP, opt_numel * 4)\n        t.free(STEP_TMP)\n",
             "", PLAN_VS_REPLAY, "a staging copy dropped: the step's fp32 copy of the gradient partition "
                                 "(stage_1_and_2.py step: flat_grad_partition.to(fp32))"),
    Mutation("staging-copy-dropped-fp32", "ledger", Z3, "t.alloc(FP32_TMP, n * tmp_bytes)", "pass",
             PLAN_VS_REPLAY, "a staging copy dropped: the .to(fp32) temporary before the master's clone()"),
    Mutation("staging-copy-dropped-defrag", "ledger", Z3, "t.alloc(DEFRAG_TMP, n_part * nb)", "pass",
             PLAN_VS_REPLAY, "a staging copy dropped: defragment()'s host copy (ZeRO-3 without param offload)"),
    Mutation("staging-copy-dropped-clone", "ledger", Z12, "t.alloc(CLONE_TMP, part * nb)", "pass",
             PLAN_VS_REPLAY, "a staging copy dropped: ZeRO-1/2's 16-bit clone before the fp32 master"),
    Mutation("partition-floor", "ledger", "src/memfit/core/ledger/context.py",
             "return ceil_div(p.numel, self.world)", "return p.numel // self.world", PLAN_VS_REPLAY,
             "ZeRO-3 partitions rounded down instead of ceil(p/W)"),
    Mutation("fp16-flat-fp32", "ledger", Z3, "pin(t, FP16_FLAT, in_cpu * nb, new)", "pin(t, FP16_FLAT, in_cpu * 4, new)",
             PLAN_VS_REPLAY, "the flat 16-bit partitions booked at 4 bytes per element"),
    Mutation("master-2-bytes", "ledger", Z3, "t.alloc(FP32, n * 4)", "t.alloc(FP32, n * 2)", PLAN_VS_REPLAY,
             "fp32 master weights at 2 bytes per element"),
    Mutation("init-grad-buffer-half", "ledger", Z3, "t.alloc(INIT_GRAD_BUF, largest * 4)",
             "t.alloc(INIT_GRAD_BUF, largest * 2)", PLAN_VS_REPLAY,
             "initialize_optimizer_states' temporary gradient buffer at half size (a transient)"),
    Mutation("zero2-alignment", "ledger", Z12, "    align = 2 * ctx.world", "    align = ctx.world", PLAN_VS_REPLAY,
             "ZeRO-1/2's flat buffer aligned to W instead of 2W elements"),
    Mutation("temp-grad-buffer-plus-one", "ledger", Z12, "pin(t, TEMP_CPU, p_max * nb, opt_pin)",
             "pin(t, TEMP_CPU, (p_max + 1) * nb, opt_pin)", PLAN_VS_REPLAY,
             "the host gradient staging buffer +1 element"),
    Mutation("offload-16bit-unpinned", "ledger", Z12,
             't.declare(OFFLOAD_16, name="16-bit host copy of the partition", device=host(opt_pin)',
             't.declare(OFFLOAD_16, name="16-bit host copy of the partition", device=host(False)', PLAN_VS_REPLAY,
             "ZeRO-2's 16-bit host partition booked pageable"),
    Mutation("adapters-16-bit", "ledger", L, "        t.alloc(HOST_ADAPTERS, n_ad * 4)\n        for p in adapters:",
             "        t.alloc(HOST_ADAPTERS, n_ad * 2)\n        for p in adapters:", PLAN_VS_REPLAY,
             "PEFT-created weights loaded at 2 bytes (peft creates them in fp32)"),
    Mutation("buffers-dropped", "ledger", L, "    t.alloc(HOST_BUFFERS, m.buffer_bytes)", "    pass", PLAN_VS_REPLAY,
             "module buffers (rotary tables) left out of the load"),
    Mutation("cast-no-op-counted", "ledger", L, "        if dtype == sc.deepspeed.precision:\n            continue",
             "        if False:\n            continue", PLAN_VS_REPLAY,
             "a param already in the training dtype counted as cast (.to() returns the same tensor)"),
    Mutation("persistence-strict", "ledger", ST, "(p.numel <= thr if sc.ds_version", "(p.numel < thr if sc.ds_version",
             PLAN_VS_REPLAY, "0.19's persistence threshold read as < instead of <="),
    Mutation("states-half", "ledger", ST, "t.alloc(OPT_STATES, opt_numel * 4 * states)",
             "t.alloc(OPT_STATES, opt_numel * 2 * states)", PLAN_VS_REPLAY, "Adam states at 2 bytes per element"),
    Mutation("grads-kept-after-step", "ledger", ST, "    t.free(GRADS_PART)\n", "    pass\n", PLAN_VS_REPLAY,
             "ZeRO-2's gradient partition kept after the optimizer step"),
    Mutation("save-fp32", "ledger", ST, "t.alloc(SAVE_HOST, ctx.n_total * nb)", "t.alloc(SAVE_HOST, ctx.n_total * 4)",
             PLAN_VS_REPLAY, "the consolidated 16-bit state dict booked at 4 bytes per element"),
    Mutation("cpu-pins-copy", "ledger", "src/memfit/core/ledger/timeline.py", 'return self.accelerator == "cuda"',
             "return True", PLAN_VS_REPLAY, "pin_memory() copying on the CPU accelerator, where it returns its input"),
    Mutation("sub-group-strict", "ledger", Z3, "if cur >= sg_size or i == len(parts) - 1:",
             "if cur > sg_size or i == len(parts) - 1:", SUB_GROUPS,
             "sub groups closed one param late (vs DeepSpeed's _create_fp16_sub_groups)"),
    # ---- activations -------------------------------------------------------------------------------------
    Mutation("activations-plus-1pct", "activations", ACT, "        total_bytes=total,",
             "        total_bytes=total * 101 // 100,", ANALYTIC_VS_TRACE, "activations +1% (vs the traced model code)"),
    Mutation("logits-fp16-loss", "activations", ACT, "+ 4 * t * arch.vocab_size\n", "+ 2 * t * arch.vocab_size\n",
             ANALYTIC_VS_TRACE, "the loss's fp32 log-softmax booked in 16 bits"),
    Mutation("eager-scores-dropped", "activations", ACT,
             "probs = softmax_bytes * b * a * s * skv + (D * b * a * s * skv if softmax_bytes != D else 0)",
             "probs = softmax_bytes * b * a * s * skv", ANALYTIC_VS_TRACE,
             "eager attention's 16-bit copy of the probabilities left out"),
    Mutation("sdpa-logsumexp-dropped", "activations", ACT, "+ D * t * hq + 4 * b * a * s\n", "+ D * t * hq\n",
             ANALYTIC_VS_TRACE, "sdpa's saved logsumexp (fp32, per query and head) left out"),
    Mutation("lora-rank-activation", "activations", ACT, "* D * t * peft.lora_r if method", "* D * t * (peft.lora_r + 1) if method",
             ANALYTIC_VS_TRACE, "LoRA's saved rank-r intermediate one wider"),
    # ---- PEFT accounting ------------------------------------------------------------------------------------
    Mutation("lora-dimension-plus-one", "peft", PEFT, 'ParamSpec(at % "lora_A" + ".weight", (r, in_features)),',
             'ParamSpec(at % "lora_A" + ".weight", (r + 1, in_features)),', PEFT_LIBRARY + PLAN_VS_REPLAY,
             "one LoRA dimension +1 (vs peft's model and the replays' trainable bytes)"),
    Mutation("prefix-bias-dropped", "peft", PEFT, '        ParamSpec(at + "transform.0.bias", (h,)),\n', "",
             PEFT_LIBRARY + PLAN_VS_REPLAY, "the prefix encoder's first bias left out"),
    Mutation("prefix-token-dim-hidden", "peft", PEFT, "        token_dim = arch.head_dim * arch.num_kv_heads",
             "        token_dim = arch.hidden_size", PEFT_LIBRARY,
             "prefix width from hidden_size on grouped-query models (peft #1901)"),
    Mutation("prompt-rows-single", "peft", PEFT, "rows = spec.num_virtual_tokens * dims.num_transformer_submodules",
             "rows = spec.num_virtual_tokens", PEFT_LIBRARY,
             "prompt tuning's embedding without the encoder-decoder's second submodule"),
    Mutation("lora-bias-all-ignored", "peft", PEFT, 'is_bias and spec.lora_bias == "all"), []))', "False), []))",
             PEFT_LIBRARY, "lora_bias='all' not training the biases of layers LoRA does not adapt"),
    # ---- DeepSpeed config reading ---------------------------------------------------------------------------
    Mutation("default-bucket", "config", DSC, 'DsField("reduce_bucket_size", I, 500_000_000, gt=0)',
             'DsField("reduce_bucket_size", I, 500_000_001, gt=0)', DS_CONFIG,
             "DeepSpeed's default reduce_bucket_size off by one (the parser's field table)"),
    Mutation("default-persistence", "config", DSC, 'DsField("param_persistence_threshold", I, 100_000,',
             'DsField("param_persistence_threshold", I, 10_000,', DS_CONFIG,
             "default stage3_param_persistence_threshold (the parser's field table)"),
    Mutation("settings-default-bucket", "config", DSS, "reduce_bucket_size: int = 500_000_000",
             "reduce_bucket_size: int = 500_000_001", DS_CONFIG,
             "ZeroSettings()'s own default (what memfit assumes when no JSON was read)"),
    Mutation("default-pin", "config", DSS, "    pin_memory: bool = True", "    pin_memory: bool = False", DS_CONFIG,
             "offload pin_memory default"),
    Mutation("auto-prefetch", "config", DSC, "int(0.9 * h * h)", "int(h * h)", DS_CONFIG,
             "'auto' stage3_prefetch_bucket_size filled as h^2 instead of 0.9 h^2 (transformers' Trainer)"),
    Mutation("auto-persistence", "config", DSC, '"zero_optimization.stage3_param_persistence_threshold", 10 * h,',
             '"zero_optimization.stage3_param_persistence_threshold", h,', DS_CONFIG,
             "'auto' persistence threshold filled as h instead of 10 h"),
)

ALLOCATOR_MUTATIONS: tuple[Mutation, ...] = ()
"""To extend when the allocator simulators are on main (issue 8, section 5): e.g. the CUDA caching
allocator's 512 B rounding or its 2 MiB/20 MiB segment sizes, the large-block split threshold, the
pinned host allocator's power-of-two rounding; each with the tests that replay recorded
``torch.cuda.memory._snapshot()`` traces through ``check_against_recording``."""

MUST_BE_CAUGHT = ("activations-plus-1pct", "pinned-flag-flipped", "staging-copy-dropped-step",
                  "ds-buffer-plus-one", "lora-dimension-plus-one")
"""Issue 13's five: each must be killed by a comparison with something measured."""


def copy_tree(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".hypothesis")
    for name in COPY:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        elif src.exists():
            shutil.copy2(src, dest / name)


def check(mutations, tree: Path) -> list[str]:
    """Mutations whose ``find`` does not occur exactly once (the code moved: update the list)."""
    stale = []
    for m in mutations:
        n = (tree / m.path).read_text(encoding="utf-8").count(m.find) if (tree / m.path).exists() else 0
        if n != 1:
            stale.append(f"{m.id}: {m.find!r} occurs {n} times in {m.path}")
    return stale


def run_one(m: Mutation, tree: Path, timeout_s: float) -> tuple[str, float, str]:
    """('killed' | 'survived' | 'timeout', seconds, the failing test or the last output line)."""
    target = tree / m.path
    original = target.read_text(encoding="utf-8")
    target.write_text(original.replace(m.find, m.replace, 1), encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), DS_ACCELERATOR="cpu", PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *m.tests]
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout_s)
        status = "survived" if r.returncode == 0 else "killed"
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("FAILED") or ln.startswith("ERROR")]
        detail = lines[0] if lines else (r.stdout.strip().splitlines() or [""])[-1]
    except subprocess.TimeoutExpired:
        status, detail = "timeout", f"no verdict within {timeout_s:g} s"
    finally:
        target.write_text(original, encoding="utf-8")
    return status, time.monotonic() - t0, detail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="mutation ids to run")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per mutation's tests")
    args = parser.parse_args(argv)
    mutations = MUTATIONS + ALLOCATOR_MUTATIONS
    if args.list:
        for m in mutations:
            print(f"{m.id:30s} {m.area:12s} {m.path}: {m.why} [{' '.join(m.tests)}]")
        return 0
    if args.only:
        unknown = set(args.only) - {m.id for m in mutations}
        if unknown:
            parser.error(f"unknown mutations: {', '.join(sorted(unknown))}")
        mutations = tuple(m for m in mutations if m.id in args.only)
    with tempfile.TemporaryDirectory(prefix="memfit-mutation-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        stale = check(mutations, tree)
        if stale:
            print("stale mutations (the code moved; update benchmarks/mutation.py):\n  " + "\n  ".join(stale))
            return 2
        results = []
        for i, m in enumerate(mutations, 1):
            status, secs, detail = run_one(m, tree, args.timeout)
            results.append((m, status, detail))
            print(f"[{i:2d}/{len(mutations)}] {status:8s} {secs:6.1f} s  {m.id}: {m.why}"
                  + (f"\n{'':22s}{detail}" if status != "survived" else ""), flush=True)
    killed = sum(1 for _, s, _ in results if s == "killed")
    timeouts = sum(1 for _, s, _ in results if s == "timeout")
    survivors = [m for m, s, _ in results if s == "survived"]
    print(f"\nkill rate: {killed}/{len(results)} = {killed / len(results):.1%}"
          + (f" (+{timeouts} timed out)" if timeouts else ""))
    for m in survivors:
        print(f"survivor: {m.id} ({m.area}, {m.path}): {m.why}")
    missed = [m.id for m, s, _ in results if m.id in MUST_BE_CAUGHT and s != "killed"]
    if missed:
        print(f"required mutations not caught: {', '.join(missed)}")
    return 1 if (missed or survivors) else 0


if __name__ == "__main__":
    sys.exit(main())
