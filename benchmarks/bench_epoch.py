"""What the epoch simulation adds to `memfit plan` (issue 19 item 1; target: at most 0.5 s for 1,000
steps of varying shapes).

For three scenarios (Llama-2-7B LoRA on one GPU, the seed's ZeRO-3 + offload, Llama-3-8B QLoRA) and a
length distribution of 5,000 samples (log-normal, median 400 tokens, cut at the planned length),
prints the best in-process time of `make_plan` with the 1,000-step epoch and without it, the
difference, and how the epoch was simulated (steps run through the allocator, steps taken from the
memo, steps past the event budget, allocator calls).
Run: python benchmarks/bench_epoch.py [--repeat N]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

CASES = {
    "llama2-7b-lora-1gpu": dict(model="meta-llama/Llama-2-7b-hf", peft_method="lora", gpus="1xrtx4090", framework="torch",
                                precision="bf16", load_dtype="bf16", micro_batch=4, gradient_checkpointing=True,
                                max_seq_length=2048),
    "seed-zero3-offload": dict(scenario=ROOT / "examples" / "kogpt-prefix-zero3-offload.yaml", max_seq_length=512),
    "llama3-8b-qlora": dict(scenario=ROOT / "examples" / "frameworks" / "qlora-llama3-8b-1x24gb.yaml"),
}


def lengths_file(d: str) -> str:
    rng = random.Random(0)
    p = Path(d) / "lengths.txt"
    p.write_text("".join(f"{max(8, int(rng.lognormvariate(6.0, 0.7)))}\n" for _ in range(5000)))
    return str(p)


def scenarios(name: str, lengths: str):
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.inputs import ScenarioInputs, merge_inputs
    from memfit.core.scenario.read import read_scenario_file

    kw = dict(CASES[name])
    path = kw.pop("scenario", None)
    base = read_scenario_file(path) if path else ScenarioInputs()
    cap = kw.pop("max_seq_length", None) or base.seq_len or 2048
    flat = merge_inputs(base, ScenarioInputs(**kw))
    with_epoch = build_scenario(replace(flat, seq_len=None, lengths=lengths, max_seq_length=cap, epoch_steps=1000))
    without = replace(with_epoch, epoch=replace(with_epoch.epoch, simulate=False))
    return with_epoch, without


def best(fn, n: int) -> tuple[float, float, object]:
    """Best wall time and best CPU time of this process (the CPU time is what a loaded machine's other
    processes do not inflate) over ``n`` runs."""
    out, t, c = None, float("inf"), float("inf")
    for _ in range(n):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        t, c = min(t, time.perf_counter() - t0), min(c, time.process_time() - c0)
    return t, c, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    from memfit.core.plan import make_plan

    with tempfile.TemporaryDirectory() as d:
        lengths = lengths_file(d)
        print(f"{'scenario':<22}{'plan s':>8}{'+epoch s':>10}{'added s':>9}{'added cpu s':>13}  steps (simulated / "
              "memo / past budget)  lengths  reserved p50 / max GiB")
        for name in CASES:
            sc_e, sc_0 = scenarios(name, lengths)
            t0, c0, _ = best(lambda: make_plan(sc_0), args.repeat)
            t1, c1, plan = best(lambda: make_plan(sc_e), args.repeat)
            e = plan.epoch
            info = (f"{e.steps} ({e.simulated} / {e.from_memo} / {e.approximated})  {e.distinct_lengths:>3}  "
                    f"{e.reserved_p50_bytes / 2**30:.2f} / {e.reserved_max_bytes / 2**30:.2f}") if e and not e.error \
                else (e.error if e else "no epoch")
            print(f"{name:<22}{t0:>8.3f}{t1:>10.3f}{t1 - t0:>9.3f}{c1 - c0:>13.3f}  {info}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
