"""The GPU validation kit: one command records a fixed set of small real runs on CUDA.

``python scripts/gpu_validate.py --out tests/fixtures/cuda`` (on a machine with one large GPU; about
6 minutes on an H200) runs every case of ``memfit.recording.kit_cases.CASES`` in its own process,
each under ``memfit.record`` with a snapshot, while nvidia-smi samples the card every 100 ms, and
writes::

    OUT/summary.json, OUT/summary.md       what ran, how long, peaks, errors, versions
    OUT/<case>/stats.rank0.json            memory_stats / host_memory_stats / mem_get_info per phase
    OUT/<case>/snapshot.rank0.pickle       the allocator's history (torch.cuda.memory._dump_snapshot)
    OUT/<case>/nvidia-smi.csv              --query-gpu=timestamp,index,memory.used, 100 ms
    OUT/<case>/case.json                   what ran (replay spec, DeepSpeed JSON used, buffer sizes,
                                           the CUDA context measured, allocator sequences)

``--dry-run`` runs the same cases, same code, on the CPU with tiny configs (no snapshot, no
nvidia-smi): the test suite runs it so the kit cannot rot. ``--only NAME`` runs some cases;
``--budget-s`` stops starting cases once that much time has gone (default 450 s on a GPU, under 8
minutes of a device lease; none in a dry run, whose wall time a loaded CI machine stretches);
an existing non-empty OUT is refused (memfit never overwrites a recording).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from memfit.core.writing import write_file
from memfit.recording.kit_cases import BY_NAME, CASES

SMI_QUERY = ["--query-gpu=timestamp,index,memory.used", "--format=csv", "-lms", "100"]


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": sys.version.split()[0]}
    for name in ("torch", "deepspeed", "transformers", "peft", "bitsandbytes", "accelerate", "memfit"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "missing"
    return out


NEEDS = {"deepspeed": ("deepspeed",), "lora": ("peft",), "qlora": ("peft", "bitsandbytes"), "amp": (), "fsdp2": (),
         "alloc_device": (), "alloc_pinned": ()}
"""Packages each kind of case needs beyond torch and transformers (a missing one skips the case, said so)."""


def _summary_row(case_dir: Path, name: str, status: str, wall: float, note: str = "") -> dict[str, Any]:
    row: dict[str, Any] = {"case": name, "status": status, "wall_s": round(wall, 2), "what": BY_NAME[name].what,
                           "note": note, "files": sorted(p.name for p in case_dir.iterdir()) if case_dir.exists() else []}
    stats = case_dir / "stats.rank0.json"
    if stats.exists():
        doc = json.loads(stats.read_text())
        row["phases"] = len(doc["phases"])
        row["recorder_overhead_s"] = doc.get("overhead_s")
        peaks = [p.get("memory_stats", {}) for p in doc["phases"]]
        for key, label in (("allocated_bytes.all.peak", "allocated_peak_bytes"), ("reserved_bytes.all.peak", "reserved_peak_bytes")):
            vals = [p[key] for p in peaks if key in p]
            row[label] = max(vals) if vals else None
        row["rss_peak_bytes"] = max((p.get("rss_peak_bytes") or 0) for p in doc["phases"]) or None
    info = case_dir / "case.json"
    if info.exists():
        doc = json.loads(info.read_text())
        if doc.get("error"):
            row["error"] = f"{doc['error']['type']}: {doc['error']['message'][:300]}"
        row["cuda_context_bytes"] = doc.get("cuda_context_bytes")
    return row


def _write_markdown(out: Path, summary: dict[str, Any]) -> None:
    gib = 2**30
    lines = ["# memfit GPU validation kit", "", f"- device: {summary['device']}", f"- dry run: {summary['dry_run']}",
             f"- versions: {', '.join(f'{k} {v}' for k, v in summary['versions'].items())}",
             f"- wall: {summary['wall_s']:.0f} s", "",
             "| case | status | wall (s) | allocated peak (GiB) | reserved peak (GiB) | recorder overhead (s) | note |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in summary["cases"]:
        a, rsv = r.get("allocated_peak_bytes"), r.get("reserved_peak_bytes")
        lines.append(f"| {r['case']} | {r['status']} | {r['wall_s']} | {'-' if a is None else f'{a / gib:.2f}'} | "
                     f"{'-' if rsv is None else f'{rsv / gib:.2f}'} | {r.get('recorder_overhead_s', '-')} | "
                     f"{(r.get('error') or r.get('note') or '').replace('|', '/')[:160]} |")
    lines += ["", "Compare a case with its plan: `memfit compare <scenario> OUT/<case>` (the DeepSpeed cases' scenario is "
              "rebuilt from case.json by tests/cuda/test_cuda_fixtures.py).", ""]
    write_file(out / "summary.md", "\n".join(lines), what="gpu kit")


DEFAULT_BUDGET_S = 450.0
DRY_RUN_CASE_TIMEOUT_S = 1800
"""A dry run's per-case limit: a hang guard only. A case's own ``timeout_s`` is sized for its GPU run
on a leased machine; a dry run runs on CI, whose wall time a loaded machine stretches tenfold
(alloc_device: 5.1 s idle, 59 s with both cores busy and other test processes running)."""


def run_kit(out: Path, *, dry: bool, only: list[str] | None = None, budget_s: float | None = None,
            python: str | None = None) -> dict[str, Any]:
    """Run the cases into ``out``. ``budget_s``: stop starting cases after that many seconds (None:
    ``DEFAULT_BUDGET_S`` on a GPU, no budget in a dry run; ``inf``: none)."""
    if budget_s is None:
        budget_s = None if dry else DEFAULT_BUDGET_S
    elif budget_s != budget_s or budget_s <= 0 or budget_s == float("inf"):
        budget_s = None
    if out.exists() and any(out.iterdir()):
        from memfit.errors import MemfitError

        raise MemfitError(f"{out} is not empty; the kit never overwrites a recording (give a new --out)")
    out.mkdir(parents=True, exist_ok=True)
    names = only or [c.name for c in CASES]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        from memfit.errors import MemfitError

        raise MemfitError(f"unknown case(s) {', '.join(unknown)}; cases: {', '.join(BY_NAME)}")
    versions = _versions()
    smi = shutil.which("nvidia-smi") if not dry else None
    device = "cpu (dry run)"
    if not dry:
        r = subprocess.run([smi, "--query-gpu=name,memory.total", "--format=csv,noheader"], capture_output=True, text=True) \
            if smi else None
        device = r.stdout.strip() if r is not None and r.returncode == 0 else "cuda (nvidia-smi not found)"
    t0 = time.perf_counter()
    rows = []
    for name in names:
        case = BY_NAME[name]
        case_dir = out / name
        missing = [p for p in NEEDS[case.kind] if versions.get(p) == "missing"]
        if missing:
            rows.append(_summary_row(case_dir, name, "skipped", 0.0, f"not installed: {', '.join(missing)}"))
            continue
        if budget_s is not None and time.perf_counter() - t0 > budget_s:
            rows.append(_summary_row(case_dir, name, "skipped", 0.0, f"time budget of {budget_s:.0f} s spent"))
            continue
        case_dir.mkdir()
        sampler = None
        if smi:
            fh = (case_dir / "nvidia-smi.csv").open("w", encoding="utf-8")
            sampler = subprocess.Popen([smi, *SMI_QUERY], stdout=fh, stderr=subprocess.DEVNULL)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if dry:
            env["DS_ACCELERATOR"] = "cpu"
        cmd = [python or sys.executable, "-m", "memfit.recording.kit_cases", name, str(case_dir)] + (["--dry-run"] if dry else [])
        start = time.perf_counter()
        limit = max(case.timeout_s, DRY_RUN_CASE_TIMEOUT_S) if dry else case.timeout_s
        with (case_dir / "log.txt").open("w", encoding="utf-8") as log:
            try:
                proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=limit)
                status = "ok" if proc.returncode == 0 else "failed"
                note = "" if proc.returncode in (0, 1) else f"exit status {proc.returncode} (see log.txt)"
            except subprocess.TimeoutExpired:
                status, note = "failed", f"timed out after {limit} s"
        if sampler is not None:
            sampler.terminate()
            sampler.wait(timeout=10)
            fh.close()
        rows.append(_summary_row(case_dir, name, status, time.perf_counter() - start, note))
        print(f"{name}: {status} ({time.perf_counter() - start:.1f} s)", flush=True)
    summary = {"kit": "memfit.gpu_kit", "version": 1, "dry_run": dry, "device": device, "versions": versions,
               "wall_s": round(time.perf_counter() - t0, 1), "budget_s": budget_s, "cases": rows}
    write_file(out / "summary.json", json.dumps(summary, indent=1) + "\n", what="gpu kit")
    _write_markdown(out, summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu_validate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="tests/fixtures/cuda", help="output folder (must be new or empty)")
    ap.add_argument("--dry-run", action="store_true", help="same cases on the CPU with tiny sizes (what CI runs)")
    ap.add_argument("--only", nargs="*", help="run only these cases")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--budget-s", type=float, default=None,
                    help=f"stop starting cases after this many seconds (default {DEFAULT_BUDGET_S:g} on a GPU, none in a "
                         "dry run; inf: none)")
    args = ap.parse_args(argv)
    if args.list:
        for c in CASES:
            print(f"{c.name:18s} {c.kind:12s} {c.what}")
        return 0
    from memfit.errors import MemfitError

    try:
        summary = run_kit(Path(args.out), dry=args.dry_run, only=args.only, budget_s=args.budget_s)
    except MemfitError as exc:
        print(f"gpu_validate: error: {exc}", file=sys.stderr)
        return 2
    failed = [r["case"] for r in summary["cases"] if r["status"] == "failed"]
    print(f"wrote {args.out}/summary.json ({len(summary['cases'])} cases, {summary['wall_s']} s); failed: {failed or 'none'}")
    return 1 if failed else 0
