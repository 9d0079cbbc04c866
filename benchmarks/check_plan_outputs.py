"""Issue 22's guard for start-up work: `memfit plan` prints the same bytes before and after a change.

For every file under examples/ (recursively) and benchmarks/cases/ it runs, in a fresh process of the
``src`` tree given (``--src``, default this checkout's):
- ``memfit plan FILE --json`` and ``memfit plan FILE`` (the terminal page, COLUMNS=120), FILE as the scenario
  (a file that is no scenario gives its one-line refusal, which is compared too);
- DeepSpeed configs (examples/deepspeed/*.json) also as ``--deepspeed FILE --model kogpt --json``, a
  BitsAndBytesConfig as ``--bnb-config``, a TrainingArguments/SFTConfig as ``--training-args``, an
  accelerate config as ``--accelerate-config`` (with llama3-8b).
Each run's exit status, stdout and stderr go into one JSON file (``--out``); ``--compare A B`` says which
runs differ between two such files (exit status 1 if any).
Run: python benchmarks/check_plan_outputs.py --src /path/to/old/src --out old.json
     python benchmarks/check_plan_outputs.py --out new.json
     python benchmarks/check_plan_outputs.py --compare old.json new.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def runs() -> list[list[str]]:
    files = sorted(p for d in (ROOT / "examples", ROOT / "benchmarks" / "cases") for p in d.rglob("*") if p.is_file())
    out = []
    for f in files:
        rel = str(f.relative_to(ROOT))
        out += [["plan", rel, "--json"], ["plan", rel]]
        if f.name.startswith(("sft_config", "trainer_args")):
            out.append(["plan", "--training-args", rel, "--model", "llama3-8b", "--peft", "lora", "--json"])
        elif f.suffix == ".json" and f.parent.name == "deepspeed":
            out.append(["plan", "--deepspeed", rel, "--model", "kogpt", "--json"])
        elif f.name.startswith("accelerate"):
            out.append(["plan", "--accelerate-config", rel, "--model", "llama3-8b", "--json"])
        elif f.name.startswith("bnb"):
            out.append(["plan", "--bnb-config", rel, "--model", "llama3-8b", "--peft", "lora", "--json"])
    return out


def run_one(src: str, args: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=src, COLUMNS="120")
    p = subprocess.run([sys.executable, "-m", "memfit.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True)
    return {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", default=str(ROOT / "src"))
    parser.add_argument("--out")
    parser.add_argument("--compare", nargs=2)
    parser.add_argument("--jobs", type=int, default=2)
    a = parser.parse_args()
    if a.compare:
        old, new = (json.loads(Path(p).read_text()) for p in a.compare)
        differ = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
        for k in differ:
            print(f"differs: memfit {k}")
        print(f"{len(old.keys() & new.keys()) - len(differ)} of {len(old.keys() | new.keys())} runs identical "
              f"(exit status, stdout, stderr)")
        sys.exit(1 if differ else 0)
    todo = runs()
    with ThreadPoolExecutor(a.jobs) as pool:
        results = list(pool.map(lambda args: run_one(a.src, args), todo))
    Path(a.out).write_text(json.dumps({" ".join(k): v for k, v in zip(todo, results)}, indent=1, sort_keys=True))
    print(f"{len(todo)} runs written to {a.out}; exit statuses: "
          f"{sorted({r['rc'] for r in results})}")


if __name__ == "__main__":
    main()
