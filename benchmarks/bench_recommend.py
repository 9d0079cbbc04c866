"""Speed of `memfit recommend` (target, issue 22: at least 100,000 candidate configurations per second;
CPU seconds are the figure to read on a shared machine, wall seconds are printed beside them).

For the seed scenario, Llama-2-7B LoRA on 1x24 GB and Llama-3-70B full fine-tuning on 8x80 GB, prints:
- candidates/s of the search as `recommend` runs it (fast per-phase peaks, the headroom check, the
  step-time estimate and change count of those that fit), from fresh per-scenario aggregates;
- candidates/s of the fast estimator alone, caches warm;
- the exact ledger's time per plan, for comparison;
- `recommend` end to end (resolve, search, confirm the top 5 with the exact ledger), its top
  configuration, and the largest fast-vs-exact difference over the confirmed ones.
Run: python benchmarks/bench_recommend.py
"""

from __future__ import annotations

import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = {
    "seed (kogpt prefix, ZeRO-3 offload, 2x RTX 3090)": ROOT / "examples" / "kogpt-prefix-zero3-offload.yaml",
    "Llama-2-7B LoRA, 1x RTX 3090": ROOT / "examples" / "llama2-7b-lora-1x24gb.yaml",
    "Llama-3-70B full, 8x A100-80GB": ROOT / "examples" / "llama3-70b-full-8x80gb.yaml",
}


def main() -> None:
    from memfit.core.plan import make_plan
    from memfit.core.recommend import prepare, recommend
    from memfit.core.recommend.deepspeed.estimate import estimate_peaks
    from memfit.core.recommend.deepspeed.search import search
    from memfit.core.recommend.deepspeed.space import enumerate_candidates
    from memfit.core.scenario.read import read_scenario_file

    for label, path in SCENARIOS.items():
        inputs = read_scenario_file(path)
        prep = prepare(inputs)
        cpu0 = time.process_time()
        found = search(prep)  # fresh aggregates: the caches are built during this run
        cpu = time.process_time() - cpu0
        n, seconds, fitting = found.searched, found.seconds, found.fitting
        valid = prep.valid
        cands = list(enumerate_candidates(prep.space, allowed=lambda s, o, p, pr, valid=valid: valid[(s, pr)]))
        t0 = time.perf_counter()
        for c in cands:
            estimate_peaks(prep.aggregates, c)
        warm = len(cands) / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(5):
            make_plan(prep.scenario)
        exact_ms = (time.perf_counter() - t0) / 5 * 1000
        t0, cpu0 = time.perf_counter(), time.process_time()
        r = recommend(inputs, top=5)
        total, total_cpu = time.perf_counter() - t0, time.process_time() - cpu0
        top = r.recommendations[0] if r.recommendations else None
        print(f"{label}:\n"
              f"  search: {n:,} candidates in {seconds:.2f} s wall = {n / seconds:,.0f} candidates/s; "
              f"{cpu:.2f} s CPU = {n / cpu:,.0f} candidates/s ({fitting:,} fit every phase)\n"
              f"  fast estimator alone (warm): {warm:,.0f} candidates/s; exact ledger: {exact_ms:.1f} ms per plan\n"
              f"  recommend end to end: {total:.2f} s wall, {total_cpu:.2f} s CPU; fast vs exact: max difference {r.max_fast_exact_diff_bytes:,} B "
              f"over {len(r.recommendations)} confirmed configurations")
        if top is not None:
            changes = "; ".join(f"{c.setting} {c.before}->{c.after}" for c in top.changes)
            print(f"  top: {changes}\n"
                  f"       GPU {top.gpu_peak_bytes / 2**30:.2f} GiB/rank, host {top.node_cpu_peak_bytes / 2**30:.2f} "
                  f"GiB/node, est. step {top.step_time.total_s:.2f} s")


if __name__ == "__main__":
    main()
