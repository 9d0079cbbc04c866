"""What glibc keeps of a T5 checkpoint loaded as transformers <= 4.50 loads it with
``low_cpu_mem_usage=False`` (issue 20 item 3: the lead that T5's 16 MiB attention projections stay in
glibc's heap after ``from_pretrained``). A real process, RSS from /proc and glibc's ``mallinfo2``:

1. a T0_3B-shaped T5 (T5 v1.1 XL: d_model 2048, d_ff 5120 gated, 32 heads x 64, fp32; ``--layers``
   encoder and decoder blocks, 4 by default: 16 MiB q/k/v/o, 40 MiB wi_0/wi_1/wo) is built at random
   and saved with ``torch.save`` (a one-file ``pytorch_model.bin``);
2. a fresh process builds the random model (``cls(config)``), ``torch.load``s the state dict,
   ``load_state_dict``s it, frees the state dict, then moves the weights off the host
   (``model.to("meta")`` frees each CPU storage as ``.cuda()`` does) and prints what stayed.

    python benchmarks/bench_heap_kept_t5.py [--layers 4]

Observed here (glibc 2.36, torch 2.13, transformers 5.24, 4+4 layers, 2.86 GB of tensors of which
0.81 GB are <= 32 MiB): RSS after the weights left 5.8-6.5 MB above the start (two runs); glibc's heap keeps 0.7 MB
free. Every tensor of the load is allocated before the first free raises glibc's mmap threshold, so
each is mapped and unmapped on free: nothing of the 16 MiB tensors is kept on this path (as
``host_process_measured.json``'s ``from_pretrained_kept`` rows found for Llama shapes).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r'''
import ctypes, gc, json, sys
import torch
from transformers import T5Config, T5ForConditionalGeneration

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) * 1024

class MI(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MI

def state():
    m = libc.mallinfo2()
    return {"rss": rss(), "heap_in_use": m.uordblks, "heap_free_kept": m.fordblks, "mmapped": m.hblkhd}

mode, path, layers = sys.argv[1], sys.argv[2], int(sys.argv[3])
cfg = T5Config(d_model=2048, d_ff=5120, num_heads=32, d_kv=64, num_layers=layers, num_decoder_layers=layers,
               feed_forward_proj="gated-gelu", tie_word_embeddings=False, vocab_size=32128)
if mode == "save":
    torch.save(T5ForConditionalGeneration(cfg).state_dict(), path)
    sys.exit()
out = {"start": state()}
model = T5ForConditionalGeneration(cfg)
out["random_model"] = state()
sd = torch.load(path, map_location="cpu", weights_only=False)
out["state_dict"] = state()
model.load_state_dict(sd, strict=False)
del sd
gc.collect()
out["state_dict_freed"] = state()
model.to("meta")
gc.collect()
out["weights_left"] = state()
sizes = [p.numel() * 4 for p in model.state_dict().values()]
out["tensor_bytes"] = sum(sizes)
out["tensor_bytes_up_to_32MiB"] = sum(s for s in sizes if s <= 32 * 2**20)
print(json.dumps(out))
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "pytorch_model.bin")
        subprocess.run([sys.executable, "-c", CHILD, "save", path, str(args.layers)], check=True)
        r = subprocess.run([sys.executable, "-c", CHILD, "run", path, str(args.layers)], check=True,
                           capture_output=True, text=True)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    start = out["start"]["rss"]
    for step in ("start", "random_model", "state_dict", "state_dict_freed", "weights_left"):
        s = out[step]
        print(f"{step:<18} RSS {s['rss'] / 2**20:9.1f} MiB (+{(s['rss'] - start) / 2**20:8.1f})  glibc heap free "
              f"kept {s['heap_free_kept'] / 2**20:6.1f} MiB, mapped {s['mmapped'] / 2**20:8.1f} MiB")
    print(f"tensors {out['tensor_bytes']:,} B, of which <= 32 MiB {out['tensor_bytes_up_to_32MiB']:,} B; "
          f"kept after the weights left: {out['weights_left']['rss'] - start:,} B")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
