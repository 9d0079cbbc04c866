"""Wall time of fake-tensor traces at full model size, and the analytic model's throughput.

    python benchmarks/bench_trace.py            # seed case (GPT-J 6B + prefix encoder) and Llama-3-70B
    python benchmarks/bench_trace.py --quick    # the seed case only

Targets (a 2-core laptop-class CPU, CPU seconds): the seed case at 2048 tokens in under 3 s once torch
is warm, Llama-3-70B within 5 s (issue 22: its 80 identical layers are written out from traces of the
first 5 and 6, ``memfit.trace.layer_reuse``; each line says how its layers were traced), and more than
10,000 analytic estimates per second.
Nothing is materialized: parameters are fake tensors, no weight is ever allocated.
"""

from __future__ import annotations

import argparse
import importlib
import time

GiB = 2**30

KOGPT = dict(model_type="gptj", vocab_size=64512, n_embd=4096, n_layer=28, n_head=16, rotary_dim=64, n_positions=2048)
LLAMA3_70B = dict(model_type="llama", vocab_size=128256, hidden_size=8192, intermediate_size=28672,
                  num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                  max_position_embeddings=8192, rope_theta=500000.0)


def bench_trace(name: str, config: dict, peft, options) -> None:
    from memfit.trace.step import trace_training_step

    start, cpu = time.perf_counter(), time.process_time()
    trace = trace_training_step(config, peft, options)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    t = trace.timings
    print(f"{name}: {cpu:.2f} s CPU, {wall:.2f} s wall (build {t.build_s:.2f} s, forward {t.forward_s:.2f} s, "
          f"backward {t.backward_s:.2f} s); {trace.total_params / 1e9:.2f} B params, "
          f"saved {trace.saved_bytes / GiB:.2f} GiB, peak {trace.peak_bytes / GiB:.2f} GiB "
          f"({trace.backward.module}, {trace.backward.op}); {trace.layer_reuse}")


def bench_analytic() -> None:
    from memfit.core.activations.analytic import estimate_activation_bytes
    from memfit.core.model import ArchSpec
    from memfit.core.peft.spec import PeftSpec

    arch = ArchSpec(model_type="llama", num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8, head_dim=128,
                    intermediate_size=28672, vocab_size=128256, mlp_kind="gated")
    peft = PeftSpec(method="lora")
    n = 50_000
    start = time.perf_counter()
    for i in range(n):
        estimate_activation_bytes(arch, peft, seq_len=256 + i % 4096, micro_batch=1 + i % 8, dtype_bytes=2,
                                  gradient_checkpointing=bool(i & 1), attention="sdpa" if i & 2 else "eager")
    wall = time.perf_counter() - start
    print(f"analytic model: {n / wall:,.0f} calls/s ({wall / n * 1e6:.1f} us per call; "
          f"target: over 10,000 calls/s, the recommender's search)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="seed case only")
    parser.add_argument("--seq", type=int, default=2048)
    args = parser.parse_args()

    start = time.perf_counter()
    importlib.import_module("memfit.trace.step")  # torch, transformers, peft
    from memfit.core.peft.spec import PeftSpec
    from memfit.trace.results import TraceOptions

    print(f"imports: {time.perf_counter() - start:.2f} s")
    seed = PeftSpec(method="prefix", num_virtual_tokens=10, prefix_projection=True, encoder_hidden_size=4096)
    options = TraceOptions(seq_len=args.seq, micro_batch=1, dtype="fp16")
    bench_trace("seed case, cold (first trace in the process)", KOGPT, seed, options)
    bench_trace("seed case, warm", KOGPT, seed, options)
    if not args.quick:
        bench_trace("Llama-3-70B full fine-tuning", LLAMA3_70B, PeftSpec(method="full"),
                    TraceOptions(seq_len=args.seq, micro_batch=1, dtype="bf16"))
        bench_trace("Llama-3-70B LoRA", LLAMA3_70B, PeftSpec(method="lora"),
                    TraceOptions(seq_len=args.seq, micro_batch=1, dtype="bf16"))
    bench_analytic()


if __name__ == "__main__":
    main()
