"""The figures of issue 22's "Done when", for the seed, a 70B FSDP2 and a QLoRA example.

Per case it prints:
- whole-process `memfit --help` and `memfit plan` (median of 5, wall and CPU seconds, with bytecode
  caching on as a pip-installed tool has it: PYTHONDONTWRITEBYTECODE is dropped and one warm-up run
  writes the .pyc files first);
- the plan in process (resolve + ledger + verdict; median of 5, CPU seconds);
- `memfit recommend` end to end (whole process, median of 5) and its search's candidates/s;
- the epoch simulation per 1,000 steps of varying shapes (`make_plan` with a 1,000-step epoch minus
  without, best of 3);
- `memfit plan --exact` (whole process, once: a trace takes seconds; `--no-exact` skips it), traced with an
  empty trace cache and then read back from it (``memfit.trace.cache``).
Every line carries the machine's 1-minute load average, since the machine is shared.
Targets (issue 22): plan < 0.2 s whole process on the seed; recommend >= 100,000 candidates/s and < 1 s
end to end; 1,000 epoch steps <= 0.5 s; a 70B --exact <= 5 s.
Run: python benchmarks/bench_speed.py [--no-exact] [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"
CASES = {
    "seed (kogpt prefix, ZeRO-3 offload)": [str(EX / "kogpt-prefix-zero3-offload.yaml")],
    "Llama-3-70B FSDP2 offload, 8x A100-80GB": [str(ROOT / "benchmarks" / "cases" / "fsdp2-offload-llama3-70b-8x80gb.yaml")],
    "Llama-3-8B QLoRA, 1x 24 GB": [str(EX / "frameworks" / "qlora-llama3-8b-1x24gb.yaml")],
}


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f}"


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    e = dict(os.environ)
    e.update(extra or {})
    e.pop("PYTHONDONTWRITEBYTECODE", None)
    e["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + e.get("PYTHONPATH", "")
    return e


def whole_process(args: list[str], n: int, cmd: list[str] | None = None,
                  extra_env: dict[str, str] | None = None, warm_env: dict[str, str] | None = None) -> tuple[float, float, int]:
    """Median wall and CPU (user + sys of the child) seconds of `python -m memfit.cli ARGS` (or of
    ``cmd``), and its rc; ``extra_env`` is added to the measured runs' environment, ``warm_env`` (else
    ``extra_env``) to the warm-up's."""
    cmd = cmd or [sys.executable, "-m", "memfit.cli", *args]
    rc = subprocess.run(cmd, env=env(extra_env if warm_env is None else warm_env),
                        capture_output=True).returncode  # warm-up: writes the .pyc files
    walls, cpus = [], []
    for _ in range(n):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        rc = subprocess.run(cmd, env=env(extra_env), capture_output=True).returncode
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus), rc


def inputs_of(args: list[str]):
    """The ScenarioInputs of the case's YAML file."""
    from memfit.core.scenario.read import read_scenario_file

    return read_scenario_file(args[0])


def in_process(args: list[str], n: int) -> float:
    from memfit.core.plan import make_plan
    from memfit.core.scenario.build import build_scenario

    times = []
    for _ in range(n):
        t0 = time.process_time()
        make_plan(build_scenario(inputs_of(args)))
        times.append(time.process_time() - t0)
    return statistics.median(times)


def search_rate(args: list[str]) -> str:
    """Candidates searched per second, as `recommend` reports its own search (top 5 confirmed)."""
    from memfit.core.recommend import recommend

    r = recommend(inputs_of(args), top=5)
    if not r.candidates_searched or not r.search_seconds:
        return f"{r.candidates_searched} candidates searched in {r.search_seconds:.4f} s (no rate)"
    return (f"{r.candidates_searched:,} candidates in {r.search_seconds:.3f} s = "
            f"{r.candidates_searched / r.search_seconds:,.0f}/s")


def epoch_cost(args: list[str]) -> str:
    """make_plan with a 1,000-step epoch of varying lengths minus make_plan without one (best of 3)."""
    import random

    from memfit.core.plan import make_plan
    from memfit.core.scenario.build import build_scenario

    rng = random.Random(0)
    seq = inputs_of(args).seq_len or 2048
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        for _ in range(5000):
            f.write(f"{max(8, min(seq, int(rng.lognormvariate(6.0, 0.8))))}\n")
        lengths = f.name
    try:
        base = inputs_of(args)
        try:
            with_epoch = replace(base, lengths=lengths, epoch_steps=1000, seq_len=None, max_seq_length=seq)
        except TypeError as e:
            return f"n/a ({e})"

        def best(inp) -> float:
            ts = []
            for _ in range(3):
                t0 = time.process_time()
                make_plan(build_scenario(inp))
                ts.append(time.process_time() - t0)
            return min(ts)

        return f"{best(with_epoch) - best(base):.3f} s CPU per 1,000 steps"
    except Exception as e:
        return f"n/a ({type(e).__name__}: {str(e)[:80]})"
    finally:
        os.unlink(lengths)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-exact", action="store_true", help="skip the --exact traces")
    parser.add_argument("--repeat", type=int, default=5)
    a = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    wall, cpu, _ = whole_process([], a.repeat, cmd=[sys.executable, "-c", "pass"])
    print(f"bare python -c pass (this interpreter's own start-up, site hooks included): {wall:.3f} s wall, "
          f"{cpu:.3f} s CPU (median of {a.repeat}; {load()})")
    wall, cpu, _ = whole_process(["--help"], a.repeat)
    print(f"memfit --help: {wall:.3f} s wall, {cpu:.3f} s CPU (median of {a.repeat}; {load()})")
    for label, args in CASES.items():
        print(f"{label}:")
        wall, cpu, rc = whole_process(["plan", *args], a.repeat)
        print(f"  memfit plan whole process: {wall:.3f} s wall, {cpu:.3f} s CPU, rc {rc} ({load()})")
        print(f"  plan in process: {in_process(args, a.repeat):.3f} s CPU ({load()})")
        wall, cpu, rc = whole_process(["recommend", *args], a.repeat)
        print(f"  memfit recommend whole process: {wall:.3f} s wall, {cpu:.3f} s CPU, rc {rc} ({load()})")
        print(f"  recommend search: {search_rate(args)} ({load()})")
        print(f"  epoch simulation: {epoch_cost(args)} ({load()})")
        if not a.no_exact:
            with tempfile.TemporaryDirectory() as cache:  # an empty trace cache: the first run traces
                fresh = {"MEMFIT_CACHE_DIR": cache}
                wall, cpu, rc = whole_process(["plan", *args, "--exact"], 1, extra_env=fresh,
                                              warm_env={"MEMFIT_NO_CACHE": "1"})
                print(f"  memfit plan --exact whole process, traced: {wall:.2f} s wall, {cpu:.2f} s CPU, rc {rc} "
                      f"({load()})")
                wall, cpu, rc = whole_process(["plan", *args, "--exact"], 1, extra_env=fresh)
                print(f"  memfit plan --exact whole process, from the trace cache: {wall:.2f} s wall, {cpu:.2f} s "
                      f"CPU, rc {rc} ({load()})")


if __name__ == "__main__":
    main()
