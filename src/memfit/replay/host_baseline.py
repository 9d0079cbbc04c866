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
  are) of 32,000, 128,000 and 250,880 tokens with as many merges, built in memory;
  ``tokenizer_file``: the same tokenizers saved as tokenizer.json and read back by
  ``Tokenizer.from_file`` in a fresh process (how ``from_pretrained`` loads a fast tokenizer): the
  JSON parse leaves about 2.2-2.9 times the built tokenizer's RSS;
- ``dataloader_worker``: a ``torch.utils.data.DataLoader`` worker (fork) iterating an in-memory
  tokenized dataset (Python lists, as ``datasets.map`` outputs without a format) of two sizes: what
  each worker owns besides the pages it shares with the trainer;
- ``heap_after_free``: a checkpoint read shard by shard (tensors loaded, copied into the model,
  dropped) for tensor sizes below and above glibc's largest mmap threshold: what the process keeps
  (glibc maps allocations above its mmap threshold and unmaps them on free; the threshold starts at
  128 KiB and rises to the size of each freed mapped block, at most 32 MiB (malloc.c
  ``DEFAULT_MMAP_THRESHOLD_MAX``), so later allocations below it come from the heap, which glibc
  returns only by trimming its top);
- ``trainer``: + ``from transformers import Trainer`` (accelerate with it);
- ``from_pretrained_kept``: a Llama-3-8B-shaped checkpoint (2 layers, bf16) loaded the ways
  transformers' releases load it (safetensors into a meta-device model; ``torch.load`` of one .bin
  or of 1 GB shards next to a random model), then freed as ``model.to(device)`` frees it: what the
  process keeps. The model's code is imported before the first reading: ``host.libraries`` holds it,
  and what it imports depends on the install (transformers' loss module imports scipy where scipy is
  installed: about 36 MiB, measured; a fresh virtualenv of memfit's dependencies has no scipy);
- ``datasets`` (with ``--datasets-python``): ``import datasets`` and an Arrow dataset memory-mapped by
  ``load_from_disk`` and read row by row (its touched file pages are resident).
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


def _run(body: str, env: dict[str, str] | None = None, timeout: float = 900, python: str | None = None) -> dict:
    code = HEADER + textwrap.dedent(body)
    full_env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    full_env.update(env or {})
    out = subprocess.run([python or sys.executable, "-c", code], capture_output=True, text=True, env=full_env,
                         timeout=timeout)
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
    "trainer": "import torch\nimport transformers, peft\nfrom transformers.models.llama import modeling_llama\n"
               "from transformers.models.gptj import modeling_gptj\nfrom transformers import Trainer",
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


TOKENIZER_SIZES = (32_000, 128_000, 250_880)
"""Llama-2's and Llama-3's vocabularies (about), and BLOOM's (250,880)."""
TOKENIZER_SAVE = TOKENIZER.replace("print(json.dumps({{'delta': rss() - before}}))",
                                   "d = rss() - before\ntok.save({path!r})\nprint(json.dumps({{'delta': d}}))")
TOKENIZER_FILE = """
import torch
from tokenizers import Tokenizer
before = rss()
tok = Tokenizer.from_file({path!r})
import gc; gc.collect()
print(json.dumps({{'delta': rss() - before}}))
"""


def measure_tokenizer() -> dict[str, int]:
    """The tokenizer built in memory from its vocabulary and merges (``models.BPE``)."""
    return {str(v): _run(TOKENIZER.format(vocab=v))["delta"] for v in TOKENIZER_SIZES}


def measure_tokenizer_file() -> dict[str, int]:
    """The same tokenizer saved as tokenizer.json and read back in a fresh process by
    ``Tokenizer.from_file``: what a fast tokenizer's ``from_pretrained`` does (transformers 4.x
    ``PreTrainedTokenizerFast.__init__``; 5.x for Unigram models and classes without their own
    ``__init__``). Median of three processes."""
    import tempfile

    out = {}
    with tempfile.TemporaryDirectory(prefix="memfit-tok-") as d:
        for v in TOKENIZER_SIZES:
            path = os.path.join(d, f"tokenizer_{v}.json")
            _run(TOKENIZER_SAVE.format(vocab=v, path=path))
            out[str(v)] = sorted(_run(TOKENIZER_FILE.format(path=path))["delta"] for _ in range(3))[1]
    return out


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


CHECKPOINT_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
                     "intermediate_size": 14336, "num_hidden_layers": 2, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
                     "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
                     "torch_dtype": "bfloat16"}
"""Llama-3-8B's layer and vocabulary shapes, 2 layers, bf16: q/o 32 MiB, k/v 8 MiB (inside glibc's
dynamic mmap range), the MLP's 112 MiB and the 1,002 MiB embedding and head (always mapped)."""

MAKE_CHECKPOINT = """
import torch, transformers
cfg = transformers.LlamaConfig(**{config})
torch.manual_seed(0)
m = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
m.save_pretrained({dir!r} + '/safetensors', max_shard_size='1GB')
sd = m.state_dict()
torch.save(sd, {dir!r} + '/single.bin')
keys, shards, cur, size = list(sd), [], [], 0
for k in keys:  # transformers' split (a tensor that would overflow the shard starts a new one)
    n = sd[k].numel() * sd[k].element_size()
    if cur and size + n > 10**9:
        shards.append(cur); cur, size = [], 0
    cur.append(k); size += n
shards.append(cur)
for i, ks in enumerate(shards):
    torch.save({{k: sd[k] for k in ks}}, {dir!r} + f'/shard{{i}}.bin')
print(json.dumps({{'tensor_bytes': [sd[k].numel() * sd[k].element_size() for k in keys], 'shards': len(shards)}}))
"""

LOAD = """
import gc, glob, torch, transformers
from transformers import AutoModelForCausalLM
from transformers.models.llama import modeling_llama  # the model's code and what it imports: host.libraries holds it
cfg = transformers.LlamaConfig(**{config})
before = rss()
if {path!r} == 'safetensors':  # the current loading path: meta-device model, safetensors shards
    m = AutoModelForCausalLM.from_pretrained({dir!r} + '/safetensors', dtype=torch.bfloat16)
else:  # transformers <= 4.50 with low_cpu_mem_usage=False: a random model, then each shard's state dict
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    files = [{dir!r} + '/single.bin'] if {path!r} == 'torch_load' else sorted(glob.glob({dir!r} + '/shard*.bin'))
    for f in files:
        sd = torch.load(f, weights_only=True)
        m.load_state_dict(sd, strict=False)
        del sd
        gc.collect()
loaded = rss()
m.to('meta')  # what model.to(cuda) does to the host copies: every storage freed
gc.collect()
print(json.dumps({{'before': before, 'loaded': loaded, 'after_free': rss()}}))
"""


def measure_from_pretrained() -> dict[str, dict]:
    """What the process keeps of a loaded checkpoint once the model has left host memory, for the
    loading paths of transformers' releases: safetensors into a meta-device model (4.51+, and
    low_cpu_mem_usage before), and torch.load of a .bin next to a random model (<= 4.50's default),
    one file and sharded at 1 GB (median of three fresh processes each)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="memfit-ckpt-") as d:
        made = _run(MAKE_CHECKPOINT.format(config=CHECKPOINT_CONFIG, dir=d), timeout=1800)
        out = {}
        for path in ("safetensors", "torch_load", "torch_load_sharded"):
            runs = [_run(LOAD.format(config=CHECKPOINT_CONFIG, dir=d, path=path), timeout=1800) for _ in range(3)]
            runs.sort(key=lambda r: r["after_free"] - r["before"])
            out[path] = {**runs[1], "tensor_bytes": made["tensor_bytes"], "files": 1 if path == "torch_load" else
                         made["shards"], "config": "Llama-3-8B shapes, 2 layers, bf16"}
    return out


DATASET_IMPORT = "import torch\nimport transformers\nbefore = rss()\nimport datasets\nprint(json.dumps({'delta': rss() - before}))"
DATASET_MAKE = """
import datasets
rows = [[(i * 31 + j) % 32000 for j in range({seq})] for i in range({rows})]
datasets.Dataset.from_dict({{'input_ids': rows}}).save_to_disk({dir!r})
print(json.dumps({{}}))
"""
DATASET_TOUCH = """
import datasets
before = rss()
ds = datasets.load_from_disk({dir!r})
opened = rss()
n = 0
for row in ds.with_format('numpy'):  # what a DataLoader's sampler does over an epoch: every row read
    n += len(row['input_ids'])
print(json.dumps({{'opened': opened - before, 'touched': rss() - before, 'tokens': n}}))
"""


ARROW_WORKERS = """
import datasets, torch
from torch.utils.data import DataLoader
ds = datasets.load_from_disk({dir!r}).with_format('torch')
loader = DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True, prefetch_factor=2)
it = iter(loader)
for _ in range({rows} // 4):
    next(it)
pids = [w.pid for w in it._workers]
print(json.dumps({{'private': sorted(private(p) for p in pids), 'trainer_rss': rss()}}))
"""


def measure_datasets(python: str) -> dict:
    """``import datasets`` (pyarrow with it), and an Arrow dataset as ``datasets.map`` writes it
    (``save_to_disk``: an int64 list column), memory-mapped by ``load_from_disk`` and read row by
    row: the mapped file pages count in RSS once touched (page cache the kernel may reclaim); and two
    DataLoader workers iterating it (their private pages: the mapped file is shared, not copied)."""
    import tempfile

    out = {"python": python}
    out["import_delta"] = sorted(_run(DATASET_IMPORT, python=python)["delta"] for _ in range(3))[1]
    rows = {}
    for n in (4_000, 16_000):
        with tempfile.TemporaryDirectory(prefix="memfit-arrow-") as d:
            _run(DATASET_MAKE.format(rows=n, seq=512, dir=d + "/ds"), python=python)
            rows[str(n)] = {"rows": n, "seq_len": 512, **_run(DATASET_TOUCH.format(dir=d + "/ds"), python=python),
                            "workers": _run(ARROW_WORKERS.format(dir=d + "/ds", rows=n), python=python)}
    out["mapped"] = rows
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memfit.replay.host_baseline", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join("src", "memfit", "core", "ledger", "host_process_measured.json"))
    parser.add_argument("--only", nargs="*", default=None,
                        help="re-measure only these parts (imports, tokenizer, tokenizer_file, workers, heap, from_pretrained, "
                             "datasets) into the existing --out")
    parser.add_argument("--datasets-python", default=None,
                        help="a Python with the `datasets` package (it is not one of memfit's dependencies), for the "
                             "datasets part; without it that part is skipped")
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
             "tokenizer_file": ("tokenizer_file_rss_delta", measure_tokenizer_file),
             "workers": ("dataloader_workers", measure_workers), "heap": ("heap_after_free", measure_heap),
             "from_pretrained": ("from_pretrained_kept", measure_from_pretrained)}
    if args.datasets_python:
        parts["datasets"] = ("datasets", lambda: measure_datasets(args.datasets_python))
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
