"""Mutation score: does the test suite catch small deliberate bugs, by comparison with something real?

    python benchmarks/mutation.py                 # baseline, then every mutation; prints the kill rate and the survivors
    python benchmarks/mutation.py --only ID ...   # some of them (their tests' baseline first)
    python benchmarks/mutation.py --list          # the mutations and the tests each runs
    python benchmarks/mutation.py --no-baseline   # skip the unmutated run (only when it was just done)
    python benchmarks/mutation.py --include-unobservable  # also the unscored UNOBSERVABLE_MUTATIONS

Each mutation is one textual change (``find`` -> ``replace``, which must occur exactly once) to the
DeepSpeed ledger, the activation model, the PEFT accounting, the DeepSpeed config reading, the
allocator simulators (CUDA caching allocator, expandable segments, pinned host allocator, GPU
memory outside PyTorch) or the ledgers outside DeepSpeed (DDP buckets, FSDP shards, bitsandbytes
storage, optimizer states, autocast's weight copies). The script copies the source tree (src/,
tests/, examples/, scripts/, docs/, pyproject.toml, README.md) to a temporary directory once. It
first runs every test selection the chosen mutations use on the unmutated copy: a selection that
fails there would "kill" every mutation for nothing, so the script stops (exit 2) and names it.
Then, for each mutation, it edits the copy, runs the tests named for it there
(``PYTHONPATH=<copy>/src``, ``pytest -x``, with a timeout, ``KNOWN_FAILING`` deselected), and puts
the file back. The checkout is never modified.

A mutation is *killed* when one of its tests fails a comparison (an AssertionError or
``pytest.fail`` raised in the test code under tests/), *crashed* when the run fails otherwise (the
ledger's own consistency checks, an exception in the code: the mutation broke the code, not its
numbers; not counted as a kill), *timeout* when no verdict came in time, and *survives* when the
tests pass. The tests chosen for each are comparisons with something measured or built by the real
library: replay fixtures (real DeepSpeed and torch/DDP/FSDP runs on this CPU), fake-tensor traces
(equal to real CPU tensors), torch's own trackers and functions (``FSDPMemTracker``,
``_compute_bucket_assignment_by_size``, DDP's reducer, FSDP1's flat parameters, ``torch.autocast``,
the optimizers' state dicts), bitsandbytes' real quantized storage on this CPU, peft's and
transformers' own models, DeepSpeed's own config classes; for the allocator simulators, which no
CPU can run, the allocation sequences torch's own test suite checks on GPUs
(tests/core/test_alloc_vs_torch_tests.py), published programs with their GPU readings, and cases
derived by hand from the allocator source (tests/core/test_alloc_cuda.py, test_alloc_pinned.py,
test_alloc_seed.py). Never the recommender's fast estimator against the ledger (a
self-comparison), nor a test that restates memfit's own constants.

What it prints: one line per mutation (killed / crashed / survived / timeout, seconds, the first
failing test), then ``kill rate: K/N``, every survivor and every crash, and whether issue 13's five
required mutations (``MUST_BE_CAUGHT``) were caught. Exit status 0 only when every scored mutation
was killed.
``UNOBSERVABLE_MUTATIONS`` are real bugs no measurement here can see (each with the reason); they
are listed by ``--list``, run only on request, and never scored. ``NOT_MUTATED`` lists what has no
mutation here and why.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mutations import KNOWN_FAILING, MUST_BE_CAUGHT, SCORED, UNOBSERVABLE_MUTATIONS, Mutation  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
COPY = ("src", "tests", "examples", "scripts", "docs", "pyproject.toml", "README.md")
TIMEOUT_S = 600


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


def pytest_cmd(tests: tuple[str, ...]) -> list[str]:
    deselect = [a for node in KNOWN_FAILING for a in ("--deselect", node)]
    return [sys.executable, "-m", "pytest", "-x", "-q", "--tb=line", "-p", "no:cacheprovider", "-o", "addopts=", *tests,
            *deselect]


def test_env(tree: Path) -> dict[str, str]:
    # COLUMNS: pytest's summary lines keep the failure's message whole (what the report prints)
    return dict(os.environ, PYTHONPATH=str(tree / "src"), DS_ACCELERATOR="cpu", PYTHONDONTWRITEBYTECODE="1",
                COLUMNS="1000")


def baseline(mutations, tree: Path, timeout_s: float) -> list[str]:
    """Every test selection of ``mutations``, unmutated: the ones that fail (or time out)."""
    failing = []
    for tests in dict.fromkeys(m.tests for m in mutations):
        t0 = time.monotonic()
        try:
            r = subprocess.run(pytest_cmd(tests), cwd=tree, env=test_env(tree), capture_output=True, text=True,
                               timeout=timeout_s)
            ok, tail = r.returncode == 0, (r.stdout.strip().splitlines() or [""])[-1]
        except subprocess.TimeoutExpired:
            ok, tail = False, f"no verdict within {timeout_s:g} s"
        print(f"baseline {'ok  ' if ok else 'FAIL'} {time.monotonic() - t0:6.1f} s  {' '.join(tests)}: {tail}", flush=True)
        if not ok:
            failing.append(" ".join(tests))
    return failing


def verdict(returncode: int, stdout: str) -> tuple[str, str]:
    """('killed' | 'crashed' | 'survived', the first failing test's summary line). Run with
    ``--tb=line``, pytest prints where each failure was raised (``path:line: Exception: message``).
    A failure counts as a kill only when a test's comparison failed: an AssertionError (or
    ``pytest.fail``'s Failed) raised in the test code under tests/. An error raised elsewhere (the
    ledger's own consistency checks, "ledger bug: ...", an exception in memfit or a library, a
    collection error) is a crash: the mutation broke the code rather than its numbers."""
    lines = stdout.strip().splitlines()
    if returncode == 0:
        return "survived", lines[-1] if lines else ""
    failed = [ln for ln in lines if ln.startswith("FAILED") or ln.startswith("ERROR")]
    detail = failed[0] if failed else (lines[-1] if lines else "")
    raised = next((m for m in (re.match(r"^(\S+\.py):\d+: (\w+)", ln) for ln in lines) if m), None)
    ok = (detail.startswith("FAILED") and raised is not None and "/tests/" in raised.group(1)
          and raised.group(2) in ("assert", "AssertionError", "Failed"))  # "assert": a bare assert's line
    return ("killed" if ok else "crashed"), detail


def run_one(m: Mutation, tree: Path, timeout_s: float) -> tuple[str, float, str]:
    """('killed' | 'crashed' | 'survived' | 'timeout', seconds, the failing test or the last output line)."""
    target = tree / m.path
    original = target.read_text(encoding="utf-8")
    target.write_text(original.replace(m.find, m.replace, 1), encoding="utf-8")
    env = test_env(tree)
    cmd = pytest_cmd(m.tests)
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout_s)
        status, detail = verdict(r.returncode, r.stdout)
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
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of the test selections")
    parser.add_argument("--include-unobservable", action="store_true",
                        help="also run UNOBSERVABLE_MUTATIONS (kept out of the score; each is expected to survive)")
    args = parser.parse_args(argv)
    mutations = SCORED
    unscored = {m.id for m in UNOBSERVABLE_MUTATIONS}
    if args.include_unobservable or args.list or (args.only and set(args.only) & unscored):
        mutations += UNOBSERVABLE_MUTATIONS
    dup = sorted({m.id for m in mutations if sum(1 for x in mutations if x.id == m.id) > 1})
    if dup:
        parser.error(f"duplicate mutation ids: {', '.join(dup)}")
    if args.list:
        for m in mutations:
            mark = " (unobservable, not scored)" if m.id in unscored else ""
            print(f"{m.id:30s} {m.area:12s} {m.path}: {m.why}{mark} [{' '.join(m.tests)}]")
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
        if not args.no_baseline:
            failing = baseline(mutations, tree, args.timeout)
            if failing:
                print("these test selections fail unmutated, so they cannot tell a mutation apart (fix them, or add "
                      "the failing test to KNOWN_FAILING with the reason):\n  " + "\n  ".join(failing))
                return 2
        results = []
        for i, m in enumerate(mutations, 1):
            status, secs, detail = run_one(m, tree, args.timeout)
            results.append((m, status, detail))
            print(f"[{i:2d}/{len(mutations)}] {status:8s} {secs:6.1f} s  {m.id}: {m.why}"
                  + (f"\n{'':22s}{detail}" if status != "survived" else ""), flush=True)
    extra = [(m, s) for m, s, _ in results if m.id in unscored]
    results = [r for r in results if r[0].id not in unscored]
    killed = sum(1 for _, s, _ in results if s == "killed")
    timeouts = sum(1 for _, s, _ in results if s == "timeout")
    crashed = [(m, d) for m, s, d in results if s == "crashed"]
    survivors = [m for m, s, _ in results if s == "survived"]
    if results:
        print(f"\nkill rate: {killed}/{len(results)} = {killed / len(results):.1%}"
              + (f" (+{timeouts} timed out)" if timeouts else "") + (f" ({len(crashed)} crashed)" if crashed else ""))
    for m in survivors:
        print(f"survivor: {m.id} ({m.area}, {m.path}): {m.why}")
    for m, d in crashed:
        print(f"crashed (not a kill): {m.id}: {d}")
    for m, st in extra:
        print(f"unobservable (not scored): {m.id} {st}")
    missed = [m.id for m, s, _ in results if m.id in MUST_BE_CAUGHT and s != "killed"]
    if missed:
        print(f"required mutations not caught: {', '.join(missed)}")
    return 1 if (missed or survivors or crashed) else 0


if __name__ == "__main__":
    sys.exit(main())
