"""Issue 24's "Reproductions", each run as the user would, in a fresh process: its exit status, wall
time, CPU time (user + system) and peak resident memory, and the last line it wrote to stderr.

Target (issue 24, "Done when"): one line and exit 2 within 10 s and under 1 GiB, or the right answer
(exit 0; a misspelled accelerate key is a warning naming the key meant). Wall time on a loaded
machine is longer than CPU time; CPU time is the work. The tests cover each family without timing
it (tests/robustness/); this prints the figures.

Run: python benchmarks/issue24_reproductions.py [--keep DIR] [--skip-exact] [--skip-big]
(--skip-exact: the 1,024-layer --exact trace, about a minute of CPU; --skip-big: the three large
record files, made by benchmarks/bench_records.py, about a minute to write.)
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "examples" / "kogpt-prefix-zero3-offload.yaml"
CYCLE = "model: gpt2\nname: &a [*a]\n"
TINY = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1024,
        "num_attention_heads": 4, "num_key_value_heads": 2}
ACC_FSDP = ("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nmixed_precision: bf16\nnum_machines: 1\n"
            "num_processes: 2\nfsdp_config:\n  fsdp_version: 2\n  fsdp_ofload_params: true\n")
ACC_DS = ("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nmixed_precision: bf16\nnum_machines: 1\n"
          "num_processes: 2\ndeepspeed_config:\n  zero_stage: 2\n  offload_optimiser_device: cpu\n")
API = """
import math, torch, memfit
from memfit.errors import MemfitError
m = torch.nn.Linear(16, 16)
ds = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}
kwargs = %s
try:
    memfit.check(m, **kwargs)
except MemfitError as exc:
    print("MemfitError:", exc, file=sys.stderr)
    sys.exit(2)
"""
API_CASES = {
    "check ddp='x'": "dict(framework='ddp', ddp='x', gpus='2xa100-80gb')",
    "check ddp=[1,2]": "dict(framework='ddp', ddp=[1, 2], gpus='2xa100-80gb')",
    "check fsdp=5": "dict(framework='fsdp', fsdp=5, gpus='2xa100-80gb')",
    "check ddp bucket_cap_mb nan": "dict(framework='ddp', ddp={'bucket_cap_mb': math.nan}, gpus='2xa100-80gb')",
    "check grad_accum=0": "dict(framework='ddp', grad_accum=0, gpus='2xa100-80gb')",
    "check DeepSpeed dict + precision": "dict(ds_config=ds, precision='amp_bf16', gpus='1xa100-80gb')",
}
RECORD_LINK = """
import memfit, sys
from memfit.errors import MemfitError
try:
    with memfit.record(sys.argv[1]):
        pass
except MemfitError as exc:
    print("MemfitError:", exc, file=sys.stderr)
    sys.exit(2)
"""


def cases(work: Path, *, exact: bool, big: bool) -> list[tuple[str, list[str]]]:
    w = work
    (w / "a.yaml").write_text(CYCLE)
    (w / "acc_fsdp.yaml").write_text(ACC_FSDP)
    (w / "acc_ds.yaml").write_text(ACC_DS)
    (w / "ta_wd.json").write_text(json.dumps({"weight_decay": "x"}))
    (w / "ta_ep.json").write_text(json.dumps({"num_train_epochs": {}}))
    (w / "ta_cpu.json").write_text(json.dumps({"use_cpu": True}))
    (w / "acc_m0.yaml").write_text("distributed_type: MULTI_GPU\nnum_processes: 2\nnum_machines: 0\n")
    (w / "bnb.json").write_text(json.dumps({"load_in_4bit": True, "llm_int8_skip_modules": 5}))
    (w / "len400.txt").write_text("9" * 400 + "\n")
    (w / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (w / "stats.json").write_text('{"forward": {"allocated_bytes.all.peak": %s}}' % ("9" * 5000))
    (w / "smi.csv").write_text("timestamp, memory.used [MiB]\n2024/05/01 12:00:00.000, %s MiB\n" % ("9" * 5000))
    (w / "ds.log").write_text("Engine after forward\nMA %s GB         Max_MA 0.0 GB         CA 0.0 GB         Max_CA 0 GB\n"
                              % ("9" * 400))
    frs = [{"filename": "/x/engine.py", "line": 3, "name": "f"}]
    blk = {"size": 512, "requested_size": 500, "state": "active_allocated", "frames": frs}
    seg = {"device": 0, "address": 1 << 32, "total_size": 512 * 1000, "stream": 0, "segment_type": "small",
           "blocks": [blk] * 1000}
    pair = [{"action": a, "addr": 1 << 32, "size": 512, "stream": 0, "time_us": 1, "frames": frs}
            for a in ("alloc", "free_completed")]
    (w / "shared.pickle").write_bytes(pickle.dumps({"segments": [seg] * 5000, "device_traces": [pair * 2500] * 5000}))
    (w / "victim").write_text("keep me\n")
    (w / "d").mkdir(exist_ok=True)
    if not (w / "d" / "stats.rank0.json").is_symlink():
        os.symlink("../victim", w / "d" / "stats.rank0.json")
    (w / "config.json").write_text(json.dumps(TINY))
    py = sys.executable
    m = [py, "-m", "memfit.cli"]
    out = [
        ("alias cycle: plan a.yaml", [*m, "plan", str(w / "a.yaml")]),
        ("alias cycle: --accelerate-config", [*m, "plan", "--model", "gpt2", "--accelerate-config", str(w / "a.yaml")]),
        ("alias cycle: --training-args", [*m, "plan", "--model", "gpt2", "--training-args", str(w / "a.yaml")]),
        ("shared-reference snapshot (80 KB)", [*m, "compare", str(SEED), str(w / "shared.pickle")]),
        ("accelerate fsdp_ofload_params", [*m, "plan", "--model", "llama-2-7b", "--gpus", "2xa100-80gb",
                                           "--accelerate-config", str(w / "acc_fsdp.yaml")]),
        ("accelerate offload_optimiser_device", [*m, "plan", "--model", "llama-2-7b", "--gpus", "2xa100-80gb",
                                                 "--accelerate-config", str(w / "acc_ds.yaml")]),
        ("TrainingArguments weight_decay 'x'", [*m, "plan", "--model", "gpt2", "--training-args", str(w / "ta_wd.json")]),
        ("TrainingArguments num_train_epochs {}", [*m, "plan", "--model", "gpt2", "--training-args", str(w / "ta_ep.json")]),
        ("accelerate num_machines: 0", [*m, "plan", "--model", "gpt2", "--gpus", "2xa100-80gb", "--accelerate-config",
                                        str(w / "acc_m0.yaml")]),
        ("BitsAndBytes llm_int8_skip_modules: 5", [*m, "plan", "--model", "gpt2", "--peft", "qlora", "--bnb-config",
                                                   str(w / "bnb.json")]),
        ("lengths: a 400-digit number", [*m, "plan", "--model", "gpt2", "--lengths", str(w / "len400.txt")]),
        ("lengths: JSON nested 100,000 deep", [*m, "plan", "--model", "gpt2", "--lengths", str(w / "deep.json")]),
        ("stats JSON, 5,000-digit count", [*m, "compare", str(SEED), str(w / "stats.json")]),
        ("nvidia-smi CSV, 5,000-digit count", [*m, "compare", str(SEED), str(w / "smi.csv")]),
        ("see_memory_usage 400 digits (--json)", [*m, "compare", str(SEED), str(w / "ds.log"), "--json"]),
        ("see_memory_usage 400 digits (--report)", [*m, "compare", str(SEED), str(w / "ds.log"), "--report",
                                                    str(w / "r.html")]),
        ("see_memory_usage 400 digits (terminal)", [*m, "compare", str(SEED), str(w / "ds.log")]),
    ]
    out += [(name, [py, "-c", "import sys" + API % kw]) for name, kw in API_CASES.items()]
    out += [
        ("memfit.record through a dangling symlink", [py, "-c", RECORD_LINK, str(w / "d")]),
        ("plan gpt2 --max-seq-length 64", [*m, "plan", "--model", "gpt2", "--max-seq-length", "64"]),
        ("TrainingArguments use_cpu: true", [*m, "plan", "--model", "gpt2", "--training-args", str(w / "ta_cpu.json")]),
    ]
    if exact:
        out.append(("--exact, 1,024 layers, 32 tokens", [*m, "plan", "--model", str(w / "config.json"), "--exact",
                                                         "--seq-len", "32"]))
    if big:
        made = {"stats JSON, 125 MB": ("stats JSON, 125 MB (issue 24 item 9)", "stats125m.json"),
                "snapshot, 123 MiB": ("snapshot, 850,000 entries, 123 MiB (issue 24)", "snap850k.pickle"),
                "nvidia-smi CSV, 65 MB": ("nvidia-smi CSV, 65 MB (issue 24 item 9)", "smi65m.csv")}
        for name, (label, fname) in made.items():
            if not (w / fname).exists():  # in a process of its own (its memory is not the measured one's)
                subprocess.run([py, str(ROOT / "benchmarks" / "bench_records.py"), "--make", label, str(w / fname)],
                               check=True)
            out.append((f"{name}: compare", [*m, "compare", str(SEED), str(w / fname)]))
    return out


def measure(argv: list[str]) -> tuple[int, float, float, int, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), HF_HUB_OFFLINE="1")
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    err = proc.stderr.read().decode("utf-8", "replace").strip().splitlines()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    lines = [ln for ln in err if ln.strip() and "warning" not in ln]
    shown = (lines or err or [""])[-1]
    return (os.waitstatus_to_exitcode(status), wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024,
            shown[:100] + (f" [{len(lines)} lines]" if len(lines) > 1 else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", help="write the files here (default: a temporary directory)")
    ap.add_argument("--skip-exact", action="store_true")
    ap.add_argument("--skip-big", action="store_true")
    args = ap.parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="memfit-issue24-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"{'reproduction':42s} {'rc':>3s} {'wall s':>7s} {'CPU s':>6s} {'peak RSS':>9s}  last stderr line")
    for name, argv in cases(work, exact=not args.skip_exact, big=not args.skip_big):
        rc, wall, cpu, rss, line = measure(argv)
        print(f"{name:42s} {rc:3d} {wall:7.2f} {cpu:6.2f} {rss / 2**20:6.0f} MB  {line}", flush=True)
    if (work / "victim").read_text() != "keep me\n":
        print("the symlink's target was written")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
