"""Measure the host memory of a training process that no tensor accounts for, on this machine.

``python -m memfit.replay.host_baseline [--out src/memfit/core/ledger/host_process_measured.json]``
runs each measurement in a fresh Python process (so nothing imported earlier counts) and reads the
kernel's own figures: ``VmRSS`` from /proc/self/status, and for DataLoader workers ``Private_Clean
+ Private_Dirty`` from /proc/PID/smaps_rollup (what a forked worker adds: the pages it wrote to,
copy-on-write, not those it still shares with its parent). The JSON it writes is what
``memfit.core.ledger.host_process`` reads; it records the versions and the machine.

Measured (CPU parts; the CUDA-only parts are documented estimates in host_process.py):
- ``python``: the interpreter; ``torch``: + ``import torch`` (this CPU build);
- ``libraries``: + transformers (with a causal-LM model module) and peft; ``deepspeed``: + ``import
  deepspeed``; ``cpu_adam``: + loading DeepSpeed's cpu_adam op (its JIT-built .so), as
  DeepSpeedCPUAdam does when the optimizer is offloaded;
- ``tokenizer``: a byte-pair-encoding tokenizer (``tokenizers``, what transformers' fast tokenizers
  are) of 32,000 and 128,000 tokens with as many merges: the bytes per vocabulary entry;
- ``dataloader_worker``: a ``torch.utils.data.DataLoader`` worker (fork) iterating an in-memory
  tokenized dataset (Python lists, as ``datasets.map`` outputs without a format) of two sizes: what
  each worker owns besides the pages it shares with the trainer;
- ``heap_after_free``: a checkpoint read shard by shard (tensors loaded, copied into the model,
  dropped) for tensor sizes below and above glibc's largest mmap threshold: what the process keeps
  (glibc maps allocations above its mmap threshold and unmaps them on free; the threshold starts at
  128 KiB and rises to the size of each freed mapped block, at most 32 MiB (malloc.c
  ``DEFAULT_MMAP_THRESHOLD_MAX``), so later allocations below it come from the heap, which glibc
  returns only by trimming its top).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import textwrap
import time

HEADER = textwrap.dedent("""
    import os, json
    def rss():
        with open('/proc/self/status') as fh:
            for line in fh:
                if line.startswith('VmRSS:'):
                    return int(line.split()[1]) * 1024
    def private(pid):
        out = 0
        with open(f'/proc/{pid}/smaps_rollup') as fh:
            for line in fh:
                if line.startswith(('Private_Clean:', 'Private_Dirty:')):
                    out += int(line.split()[1]) * 1024
        return out
""")


def _run(body: str, env: dict[str, str] | None = None, timeout: float = 900) -> dict:
    code = HEADER + textwrap.dedent(body)
    full_env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    full_env.update(env or {})
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"measurement failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


IMPORTS = {
    "python": "",
    "torch": "import torch",
    "libraries": "import torch\nimport transformers, peft\nfrom transformers.models.llama import modeling_llama\n"
                 "from transformers.models.gptj import modeling_gptj",
    "deepspeed": "import torch\nimport transformers, peft\nfrom transformers.models.llama import modeling_llama\n"
                 "from transformers.models.gptj import modeling_gptj\nimport deepspeed",
    "cpu_adam": "import torch\nimport transformers, peft\nfrom transformers.models.llama import modeling_llama\n"
                "from transformers.models.gptj import modeling_gptj\nimport deepspeed\n"
                "from deepspeed.ops.op_builder import CPUAdamBuilder\nCPUAdamBuilder().load()",
}


def measure_imports() -> dict[str, int]:
    """RSS after each cumulative import set (median of three fresh processes)."""
    out = {}
    for name, imports in IMPORTS.items():
        runs = sorted(_run(imports + "\nprint(json.dumps({'rss': rss()}))")["rss"] for _ in range(3))
        out[name] = runs[1]
    return out


TOKENIZER = """
import random
import torch
from tokenizers import Tokenizer, models
V = {vocab}
rng = random.Random(0)
base = [chr(c) for c in range(33, 127)] + [chr(c) for c in range(161, 323)]  # 256 byte-level symbols
vocab = {{t: i for i, t in enumerate(base)}}
by_len = {{1: list(base)}}
merges = []
while len(vocab) < V:  # merges of two existing tokens, lengths spread like an English BPE (mostly 2-8)
    n = rng.choice((2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 8, 9, 10))
    k = rng.randint(1, n - 1)
    if k not in by_len or n - k not in by_len:
        continue
    a, b = rng.choice(by_len[k]), rng.choice(by_len[n - k])
    t = a + b
    if t not in vocab:
        vocab[t] = len(vocab)
        by_len.setdefault(len(t), []).append(t)
        merges.append((a, b))
before = rss()
tok = Tokenizer(models.BPE(vocab, merges))
del vocab, merges
import gc; gc.collect()
print(json.dumps({{'delta': rss() - before}}))
"""


def measure_tokenizer() -> dict[str, int]:
    return {str(v): _run(TOKENIZER.format(vocab=v))["delta"] for v in (32_000, 128_000)}


WORKERS = """
import torch
from torch.utils.data import DataLoader, Dataset
N, S = {samples}, {seq}
before = rss()
data = [[(i * 31 + j) % 32000 for j in range(S)] for i in range(N)]
class TokenDataset(Dataset):
    def __len__(self): return N
    def __getitem__(self, i):
        ids = torch.tensor(data[i])
        return {{'input_ids': ids, 'labels': ids.clone()}}
loader = DataLoader(TokenDataset(), batch_size=4, num_workers=2, persistent_workers=True, prefetch_factor=2)
it = iter(loader)
for _ in range(N // 4):
    next(it)
pids = [w.pid for w in it._workers]
print(json.dumps({{'private': sorted(private(p) for p in pids), 'trainer_rss': rss(), 'before_data': before}}))
"""


def measure_workers() -> dict[str, dict]:
    out = {}
    for samples in (2_000, 8_000):
        r = _run(WORKERS.format(samples=samples, seq=512))
        out[str(samples)] = {"samples": samples, "seq_len": 512, "worker_private": r["private"],
                             "trainer_rss_with_data": r["trainer_rss"], "trainer_rss_before_data": r["before_data"]}
    return out


HEAP = """
import torch
sizes = {sizes}
shards = {shards}
before = rss()
model = [torch.empty(n // 4, dtype=torch.float32) for n in sizes]
for t in model:
    t.fill_(1.0)
after_model = rss()
peak = 0
per = len(sizes) // shards
for k in range(shards):  # a checkpoint read shard by shard: its tensors loaded, copied in, dropped
    part = range(k * per, (k + 1) * per)
    state = [torch.ones(sizes[i] // 4, dtype=torch.float32) for i in part]
    for i, src in zip(part, state):
        model[i].copy_(src)
    peak = max(peak, rss())
    del state, src
import gc; gc.collect()
print(json.dumps({{'model': after_model - before, 'loaded': peak - after_model, 'kept': rss() - after_model}}))
"""


def measure_heap() -> dict[str, dict]:
    """A checkpoint read shard by shard into a model: what the process keeps once the state dicts
    are gone. glibc's mmap threshold rises (to at most 32 MiB) each time a mapped block is freed,
    so a later shard's tensors below it come from the heap."""
    mix = [2**25, 2**23, 2**23, 2**25, 2**25 + 2**24, 2**25 + 2**24, 2**25 + 2**24, 2**14, 2**14] * 8
    out = {}
    for name, sizes, shards in (("4MiB_x64_8shards", [4 * 2**20] * 64, 8), ("16MiB_x32_8shards", [16 * 2**20] * 32, 8),
                                ("64MiB_x8_4shards", [64 * 2**20] * 8, 4), ("llama_layer_mix_8shards", mix, 8)):
        r = _run(HEAP.format(sizes=sizes, shards=shards))
        out[name] = {"tensor_bytes": sizes, "shards": shards, **r}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memfit.replay.host_baseline", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join("src", "memfit", "core", "ledger", "host_process_measured.json"))
    parser.add_argument("--only", nargs="*", default=None,
                        help="re-measure only these parts (imports, tokenizer, workers, heap) into the existing --out")
    args = parser.parse_args(argv)
    import importlib.metadata as md

    versions = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "peft", "deepspeed", "tokenizers"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = "missing"
    t0 = time.time()
    parts = {"imports": ("imports_rss", measure_imports), "tokenizer": ("tokenizer_rss_delta", measure_tokenizer),
             "workers": ("dataloader_workers", measure_workers), "heap": ("heap_after_free", measure_heap)}
    result = {}
    if args.only and os.path.exists(args.out):
        with open(args.out, encoding="utf-8") as fh:
            result = json.load(fh)
    result.update({
        "how": "python -m memfit.replay.host_baseline: each figure from a fresh process; VmRSS from "
               "/proc/self/status, worker figures Private_Clean + Private_Dirty from /proc/PID/smaps_rollup",
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "libc": platform.libc_ver()[1]},
        "versions": versions,
    })
    for name, (key, fn) in parts.items():
        if not args.only or name in args.only:
            result[key] = fn()
    result["seconds"] = round(time.time() - t0, 1)
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1, sort_keys=True)
        fh.write("\n")
    print(json.dumps(result, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
