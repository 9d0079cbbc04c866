"""What the record readers' caps cost (memfit.core.records.bounded): for the largest honest file each
cap allows and for the issue's hostile and oversized files, ``memfit compare`` in a fresh process,
with its wall time, CPU time (user + system) and peak resident memory.

Targets (issue 24): every file here is answered (read and compared, or one error line) within 10 s
and 1 GiB on a 2-core machine. Wall time on a loaded machine is longer; CPU time is the work.

Run: python benchmarks/bench_records.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "examples" / "kogpt-prefix-zero3-offload.yaml"


def honest_snapshot(entries: int, frames_per_stack: int = 15, distinct_frames: int = 500) -> dict:
    """A snapshot shaped as torch writes one: frame dicts shared (torch's py_symbolize dedups them),
    one frame list per entry, stacks drawn at random (the worst case for the attribution: no two alike)."""
    rng = random.Random(0)
    pool = [{"filename": f"/usr/lib/python3/site-packages/torch/nn/modules/mod{i}.py", "line": i,
             "name": f"forward{i % 50}"} for i in range(distinct_frames)]
    base = 0x7F0000000000
    events = [{"action": "alloc" if i % 2 == 0 else "free_completed", "addr": base + (i // 2) * 512,
               "size": 512 * (1 + i % 7), "stream": 0, "time_us": 1_700_000_000_000_000 + i,
               "frames": [pool[rng.randrange(distinct_frames)] for _ in range(frames_per_stack)],
               "compile_context": "N/A", "user_metadata": ""} for i in range(entries)]
    segments = [{"device": 0, "address": base + s * 2**21, "total_size": 2**21, "allocated_size": 2**20,
                 "active_size": 2**20, "stream": 0, "segment_type": "large",
                 "blocks": [{"address": base + s * 2**21 + j * 2**17, "size": 2**17, "requested_size": 2**17 - 8,
                             "state": "active_allocated" if j % 2 else "inactive", "frames": [pool[j]]}
                            for j in range(16)]} for s in range(2000)]
    return {"segments": segments, "device_traces": [events], "allocator_settings": {}}


def stats_json(phases: int) -> str:
    counters = {f"{stat}.{pool}.{kind}": 123_456_789 for stat in ("allocation", "segment", "active", "inactive_split",
                                                                  "allocated_bytes", "reserved_bytes", "active_bytes",
                                                                  "inactive_split_bytes", "requested_bytes")
                for pool in ("all", "small_pool", "large_pool") for kind in ("current", "peak", "allocated", "freed")}
    doc = {"format": "memfit.record.stats", "version": 1, "rank": 0, "device": "cuda", "notes": [],
           "phases": [{"name": "step2.forward" if i > 8 else f"p{i}", "t_start_us": 10 * i, "t_end_us": 10 * i + 5,
                       "memory_stats": counters, "host_memory_stats": {"allocated_bytes.peak": 2**21},
                       "mem_get_info": [2**30, 80 * 2**30], "rss_peak_bytes": 2**30} for i in range(phases)]}
    return json.dumps(doc, indent=1)


def smi_csv(lines: int) -> str:
    rows = ["timestamp, index, memory.used [MiB]"]
    rows += [f"2024/05/01 {12 + i // 360000 % 12:02d}:{i // 6000 % 60:02d}:{i // 100 % 60:02d}.{i % 100 * 10:03d}, "
             f"{i % 8}, {i % 81920} MiB" for i in range(lines)]
    return "\n".join(rows) + "\n"


def ds_log(reports: int) -> str:
    out = []
    for i in range(reports):
        out.append(f"[rank0]: Engine after {('forward', 'backward', 'step')[i % 3]}")
        out.append("[rank0]: MA 12.34 GB         Max_MA 15.67 GB         CA 20.0 GB         Max_CA 21 GB ")
        out.append("[rank0]: CPU Virtual Memory:  used = 120.5 GB, percent = 40.1%")
    return "\n".join(out) + "\n"


def measure(path: Path) -> tuple[int, float, float, int, str]:
    """(exit status, wall s, CPU s, peak RSS bytes, last stderr line) of ``memfit compare SEED path``."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "memfit.cli", "compare", str(SEED), str(path), "--json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    err = proc.stderr.read().decode("utf-8", "replace").strip().splitlines()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    return (os.waitstatus_to_exitcode(status), wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024,
            err[-1][:110] if err else "")


def files() -> dict:
    shared = {"segments": [{"device": 0, "address": 1 << 40, "total_size": 512 * 1000, "stream": 0,
                            "blocks": [{"size": 512, "state": "active_allocated", "frames": []}] * 1000}] * 5000,
              "device_traces": [[{"action": "alloc", "addr": 1 << 40, "size": 4, "stream": 0}] * 5000] * 5000}
    return {
        "snapshot, 300,000 entries (the cap)": ("snap300k.pickle", lambda: pickle.dumps(honest_snapshot(300_000))),
        "snapshot, 100,000 entries (torch's default)": ("snap100k.pickle", lambda: pickle.dumps(honest_snapshot(100_000))),
        "snapshot, 850,000 entries, 123 MiB (issue 24)": ("snap850k.pickle", lambda: pickle.dumps(honest_snapshot(850_000))),
        "snapshot, 1,000,000 entries (over the cap)": ("snap1m.pickle", lambda: pickle.dumps(honest_snapshot(1_000_000))),
        "snapshot, shared references (issue 24 item 2)": ("shared.pickle", lambda: pickle.dumps(shared)),
        "snapshot, 20 MiB of EMPTY_LIST opcodes": ("lists.pickle", lambda: b"\x80\x04(" + b"]" * (20 * 2**20) + b"l."),
        "stats JSON, 10,000 full phases (~60 MiB)": ("stats10k.json", lambda: stats_json(10_000).encode()),
        "stats JSON, 125 MB (issue 24 item 9)": ("stats125m.json", lambda: stats_json(23_200).encode()),
        "nvidia-smi CSV, 700,000 lines (~32 MiB)": ("smi700k.csv", lambda: smi_csv(700_000).encode()),
        "nvidia-smi CSV, 65 MB (issue 24 item 9)": ("smi65m.csv", lambda: smi_csv(1_721_000).encode()),
        "see_memory_usage log, 80,000 reports (~15 MiB)": ("ds80k.log", lambda: ds_log(80_000).encode()),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", help="write the files here (default: a temporary directory)")
    ap.add_argument("--make", nargs=2, metavar=("LABEL", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    table = files()
    if args.make:  # in a process of its own, so the one that measures stays small (ru_maxrss counts a fork's pages)
        Path(args.make[1]).write_bytes(table[args.make[0]][1]())
        return 0
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="memfit-bench-records-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"{'file':48s} {'size':>9s} {'rc':>3s} {'wall s':>7s} {'CPU s':>6s} {'peak RSS':>9s}  answer")
    for label, (name, _) in table.items():
        path = work / name
        if not path.exists():
            subprocess.run([sys.executable, __file__, "--make", label, str(path)], check=True)
        rc, wall, cpu, rss, line = measure(path)
        print(f"{label:48s} {path.stat().st_size / 2**20:7.1f} M {rc:3d} {wall:7.2f} {cpu:6.2f} {rss / 2**20:7.0f} M  "
              f"{line if rc else 'compared'}")
        if not args.keep:
            path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
