"""Wall time of `memfit plan` (target: under 0.5 s per plan on a 2-core machine).

Prints, for the seed scenario and for Llama-3-70B full fine-tuning on 8x80 GB:
- the in-process time of resolve + ledger + verdict (best and mean of N),
- the end-to-end time of the `memfit plan` command (a fresh process, imports included),
- the cost of the allocator simulation (core/alloc: the CUDA caching and pinned host allocators fed by
  the ledger's alloc/free calls) inside the plan: the plan with and without it.
Run: python benchmarks/bench_plan.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "examples" / "kogpt-prefix-zero3-offload.yaml"
LLAMA70 = ["--model", "meta-llama/Meta-Llama-3-70B", "--gpus", "8xa100-80gb", "--deepspeed",
           str(ROOT / "examples" / "deepspeed" / "zero3_hf_trainer_auto.json"), "--seq-len", "4096"]


def in_process(args: list[str], n: int = 20) -> list[float]:
    from memfit.core.plan import make_plan
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.inputs import ScenarioInputs
    from memfit.core.scenario.read import read_scenario_file

    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        if args[0].endswith(".yaml"):
            inputs = read_scenario_file(args[0])
        else:
            kv = dict(zip(args[::2], args[1::2]))
            inputs = ScenarioInputs(model=kv["--model"], gpus=kv["--gpus"], deepspeed=kv["--deepspeed"],
                                    seq_len=int(kv["--seq-len"]))
        make_plan(build_scenario(inputs))
        times.append(time.perf_counter() - t0)
    return times


def simulation_cost(args: list[str], n: int = 20) -> tuple[float, float, int]:
    """Best in-process ledger time with and without the allocator simulators, and the events simulated."""
    from memfit.core.ledger import build
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.inputs import ScenarioInputs
    from memfit.core.scenario.read import read_scenario_file

    if args[0].endswith(".yaml"):
        inputs = read_scenario_file(args[0])
    else:
        kv = dict(zip(args[::2], args[1::2]))
        inputs = ScenarioInputs(model=kv["--model"], gpus=kv["--gpus"], deepspeed=kv["--deepspeed"],
                                seq_len=int(kv["--seq-len"]))
    sc = build_scenario(inputs)
    with_sim, without = [], []
    original = build.memory_tracker
    for _ in range(n):
        t0 = time.perf_counter()
        t = build.build_timeline(sc)
        t.phases()
        with_sim.append(time.perf_counter() - t0)
        build.memory_tracker = lambda sc: None  # noqa: E731
        try:
            t0 = time.perf_counter()
            build.build_timeline(sc).phases()
            without.append(time.perf_counter() - t0)
        finally:
            build.memory_tracker = original
    events = sum(1 for e in t.events if e[2].value in ("gpu", "cpu_pinned"))
    return min(with_sim), min(without), events


def end_to_end(args: list[str], n: int = 3) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "memfit.cli", "plan", *args, "--json"], check=True,
                       capture_output=True)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    for label, args in (("seed (kogpt prefix, ZeRO-3 offload)", [str(SEED)]), ("Llama-3-70B full, 8x A100-80GB", LLAMA70)):
        ip = in_process(args)
        e2e = end_to_end(args)
        sim, nosim, events = simulation_cost(args)
        print(f"{label}:\n  plan in process: best {min(ip) * 1000:.1f} ms, mean {statistics.mean(ip) * 1000:.1f} ms "
              f"(n={len(ip)})\n  `memfit plan` command: best {min(e2e):.2f} s, mean {statistics.mean(e2e):.2f} s "
              f"(n={len(e2e)}; target < 0.5 s)\n  allocator simulation: ledger {sim * 1000:.1f} ms with it, "
              f"{nosim * 1000:.1f} ms without ({(sim - nosim) * 1000:.1f} ms for {events:,} GPU/pinned alloc/free events)")


if __name__ == "__main__":
    main()
