"""The recorded replay cases, and the command that records them as JSON fixtures.

``python -m memfit.replay.deepspeed.record_fixtures [--out tests/fixtures/replay] [--only NAME ...]
[--overwrite] [--list] [--seed] [--sequence]`` runs each case (``CASES``) with ``run_replay`` and saves its
``Measurement`` to ``<out>/<case>.json``; existing files are kept unless ``--overwrite``. ``--seed``
records the seed scenario instead (``seed_case``, to tests/fixtures/replay_seed/; it holds about
4.3 GB of host memory at its peak). ``--sequence`` records ``SEQUENCE_CASES`` (to
tests/fixtures/replay_sequence/): cases of ``CASES`` at a size whose tensors reach the CUDA caching
allocator's large pool, keeping the training loop's allocation sequence (``ReplaySpec.alloc_sequence``).

Every case is small enough for a 2-core CPU machine (tiny GPT-J and Llama configs, a few hundred
thousand parameters, sequence 32, 2 steps) and runs on DeepSpeed's CPU accelerator in a fake world
of W ranks. Reduce buckets are kept small (``reduce_bucket_size`` 50 000 elements): on the CPU
accelerator DeepSpeed's default 5e8-element bucket would be a 1 GB host allocation per replay.

The first run JIT-builds DeepSpeed's cpu_adam and fused_adam ops (a few minutes each, cached in
~/.cache/torch_extensions); ``warm_ops()`` does it up front.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from memfit.core.peft.spec import PeftSpec
from memfit.replay.measurement import save_fixture
from memfit.replay.spec import ReplaySpec

FIXTURE_DIR = os.path.join("tests", "fixtures", "replay")
SEED_FIXTURE = os.path.join("tests", "fixtures", "replay_seed", "kogpt_prefix_zero3_offload_1layer_w2.json")
SEED_SCENARIO = os.path.join("examples", "kogpt-prefix-zero3-offload.yaml")

TINY_GPTJ: dict[str, Any] = {
    "model_type": "gptj",
    "architectures": ["GPTJForCausalLM"],
    "n_embd": 128,
    "n_head": 4,
    "rotary_dim": 16,
    "n_layer": 28,
    "n_positions": 512,
    "vocab_size": 1000,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "tie_word_embeddings": False,
}
"""GPT-J shaped like the seed's kogpt (untied head, rotary, parallel attention+MLP), 128 wide."""

TINY_LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 128,
    "intermediate_size": 344,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 32,
    "max_position_embeddings": 512,
    "vocab_size": 1000,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "tie_word_embeddings": False,
}
"""Llama with grouped-query attention, 128 wide."""

SEED_PREFIX = PeftSpec(method="prefix", num_virtual_tokens=8, prefix_projection=True, encoder_hidden_size=64)
"""Prefix tuning with a projection MLP, as the seed's prefix encoder."""

LORA = PeftSpec(method="lora", lora_r=4, lora_alpha=8, target_modules=("q_proj", "v_proj"))


def deepspeed_json(stage: int, *, offload: bool, gather_on_save: bool = True) -> dict[str, Any]:
    """The seed's DeepSpeed JSON (fp16, Adam, WarmupLR, clipping 1), ZeRO ``stage``, small buckets."""
    zero: dict[str, Any] = {
        "stage": stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": 50_000,
        "allgather_bucket_size": 50_000,
    }
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if stage == 3:
        zero.update({
            "sub_group_size": 1e9,
            "stage3_prefetch_bucket_size": 50_000,
            "stage3_param_persistence_threshold": 1000,
            "stage3_max_live_parameters": 1e9,
            "stage3_max_reuse_distance": 1e9,
            "stage3_gather_16bit_weights_on_model_save": gather_on_save,
        })
        if offload:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        "fp16": {"enabled": True, "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
                 "hysteresis": 2, "min_loss_scale": 1},
        "optimizer": {"type": "Adam", "params": {"lr": 0.001, "betas": [0.8, 0.999], "eps": 1e-8,
                                                   "weight_decay": 3e-7}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001,
                                                      "warmup_num_steps": 1000}},
        "zero_optimization": zero,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1,
        "steps_per_print": 2000,
        "train_micro_batch_size_per_gpu": 1,
        "wall_clock_breakdown": False,
    }


def _case(name: str, model: dict[str, Any], peft: PeftSpec, stage: int, *, offload: bool, world_size: int,
          **kwargs: Any) -> ReplaySpec:
    ds = deepspeed_json(stage, offload=offload)
    ds["gradient_accumulation_steps"] = kwargs.pop("gradient_accumulation_steps", 1)
    return ReplaySpec(name=name, model_config=model, layers=kwargs.pop("layers", 2), peft=peft,
                      deepspeed_config=ds, world_size=world_size,
                      seq_len=kwargs.pop("seq_len", 32), steps=kwargs.pop("steps", 2), threads=2, **kwargs)


CASES: dict[str, ReplaySpec] = {
    spec.name: spec
    for spec in (
        # The seed: prefix tuning, ZeRO-3, param+optimizer offload, fp32 load, only the prefix
        # encoder passed as model_parameters.
        _case("gptj_prefix_z3_offload_w2", TINY_GPTJ, SEED_PREFIX, 3, offload=True, world_size=2),
        _case("gptj_prefix_z3_offload_w4", TINY_GPTJ, SEED_PREFIX, 3, offload=True, world_size=4),
        _case("gptj_prefix_z3_offload_w1", TINY_GPTJ, SEED_PREFIX, 3, offload=True, world_size=1),
        _case("gptj_prefix_z3_w2", TINY_GPTJ, SEED_PREFIX, 3, offload=False, world_size=2),
        _case("gptj_prefix_z3_offload_w2_fp16load", TINY_GPTJ, SEED_PREFIX, 3, offload=True, world_size=2,
              load_dtype="fp16"),
        _case("gptj_prefix_z3_offload_w2_zero_init", TINY_GPTJ, SEED_PREFIX, 3, offload=True, world_size=2,
              zero_init=True),
        _case("gptj_prefix_z3_offload_w2_all_params", TINY_GPTJ, SEED_PREFIX, 3, offload=True, world_size=2,
              model_parameters="all"),
        _case("gptj_prefix_z2_offload_w2", TINY_GPTJ, SEED_PREFIX, 2, offload=True, world_size=2),
        _case("gptj_prefix_z2_w2", TINY_GPTJ, SEED_PREFIX, 2, offload=False, world_size=2),
        _case("gptj_full_z3_offload_w2", TINY_GPTJ, PeftSpec(method="full"), 3, offload=True, world_size=2),
        _case("llama_lora_z3_offload_w2", TINY_LLAMA, LORA, 3, offload=True, world_size=2),
        _case("llama_lora_z3_w4", TINY_LLAMA, LORA, 3, offload=False, world_size=4),
        _case("llama_lora_z2_offload_w4", TINY_LLAMA, LORA, 2, offload=True, world_size=4),
        _case("llama_lora_z2_w1", TINY_LLAMA, LORA, 2, offload=False, world_size=1),
        _case("llama_lora_z3_offload_w2_gc", TINY_LLAMA, LORA, 3, offload=True, world_size=2,
              gradient_checkpointing=True),
        # gradient accumulation: the later micro-steps (accum.*) and the steady state (step2.*)
        _case("llama_full_z1_ga2_w2", TINY_LLAMA, PeftSpec(method="full"), 1, offload=False, world_size=2,
              gradient_accumulation_steps=2),
        _case("llama_full_z2_ga3_w2", TINY_LLAMA, PeftSpec(method="full"), 2, offload=False, world_size=2,
              gradient_accumulation_steps=3),
        _case("gptj_full_z3_offload_ga2_w2", TINY_GPTJ, PeftSpec(method="full"), 3, offload=True, world_size=2,
              gradient_accumulation_steps=2),
        # W = 3: no param size divides evenly (ZeRO-3 rounds each partition up: ceil(p/W)), and
        # ZeRO-2's flat buffer pads the trainable count to a multiple of 2W, not W.
        _case("gptj_prefix_z3_offload_w3", TINY_GPTJ, SEED_PREFIX, 3, offload=True, world_size=3),
        _case("llama_lora_z2_offload_w3", TINY_LLAMA, LORA, 2, offload=True, world_size=3),
    )
}


SEQUENCE_FIXTURE_DIR = os.path.join("tests", "fixtures", "replay_sequence")
MEDIUM = {"n_embd": 512, "n_head": 8, "rotary_dim": 32, "vocab_size": 8000,
          "hidden_size": 512, "intermediate_size": 1376, "num_attention_heads": 8, "num_key_value_heads": 4}
SEQUENCE_SEQ_LEN = 384
"""Widths of the sequence cases: hidden 512, vocabulary 8,000, sequence 384 x micro-batch 2 (768 tokens,
no width equal to the token count, so an activation and a weight never share a size by chance): the
residual stream is 1.5 MiB in fp32 (large pool, 20 MiB segments), 768 KiB in bf16 (small pool), the
MLP's tensors 2-5 MiB, the logits 24.6 MB (a segment of their own)."""


def _medium(spec: ReplaySpec) -> ReplaySpec:
    import dataclasses

    cfg = {k: v for k, v in spec.model_config.items()}
    cfg.update({k: v for k, v in MEDIUM.items() if k in cfg})
    return dataclasses.replace(spec, name=f"{spec.name}_seq", model_config=cfg, seq_len=SEQUENCE_SEQ_LEN, micro_batch=2,
                               alloc_sequence=True)


SEQUENCE_CASES: dict[str, ReplaySpec] = {
    s.name: s for s in (_medium(CASES[n]) for n in (
        "gptj_prefix_z2_w2", "gptj_prefix_z3_offload_w2", "gptj_full_z3_offload_w2", "llama_lora_z3_w4",
        "llama_lora_z2_offload_w4", "llama_full_z1_ga2_w2"))
}
"""The allocation-sequence cases (``--sequence``): ZeRO-1/2/3, with and without offload, prefix, LoRA and
full fine-tuning, gradient accumulation, W = 2 and 4."""


def seed_case(root: str = ".") -> ReplaySpec:
    """The seed scenario as ``memfit replay examples/kogpt-prefix-zero3-offload.yaml --layers 1
    --seq-len 16 --steps 1`` runs it: kogpt's shapes cut to one block, the issue's DeepSpeed config
    verbatim, W = 2 on the CPU accelerator."""
    import dataclasses

    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.read import read_scenario_file
    from memfit.replay.spec import spec_from_scenario

    inputs = dataclasses.replace(read_scenario_file(os.path.join(root, SEED_SCENARIO)), seq_len=16)
    return spec_from_scenario(build_scenario(inputs), layers=1, steps=1, accelerator="cpu")


SEED_SEQUENCE = "kogpt_prefix_zero3_offload_1layer_w2_seq"


def sequence_cases(root: str = ".") -> dict[str, ReplaySpec]:
    """``SEQUENCE_CASES`` and the seed case itself (kogpt's widths, one block, ``seed_case``) with its
    allocation sequence."""
    import dataclasses

    seed = dataclasses.replace(seed_case(root), name=SEED_SEQUENCE, alloc_sequence=True)
    return {**SEQUENCE_CASES, SEED_SEQUENCE: seed}


def warm_ops(ops: tuple[str, ...] = ("cpu_adam", "fused_adam", "deepspeed_shm_comm"), timeout_s: float = 1800) -> float:
    """``memfit.replay.ops.warm_ops``: build the ops once, up front, in a supervised process."""
    from memfit.replay.ops import warm_ops as _warm

    return _warm(ops, timeout_s=timeout_s)


def main(argv: list[str] | None = None) -> int:
    from memfit.replay.runner import run_replay

    parser = argparse.ArgumentParser(prog="python -m memfit.replay.deepspeed.record_fixtures", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=FIXTURE_DIR, help="directory for <case>.json (default %(default)s)")
    parser.add_argument("--only", nargs="*", default=None, help="case names to record (default: all)")
    parser.add_argument("--overwrite", action="store_true", help="replace existing fixture files")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per replay (default %(default)s)")
    parser.add_argument("--seed", action="store_true", help=f"record the seed scenario to {SEED_FIXTURE} instead")
    parser.add_argument("--sequence", action="store_true",
                        help=f"record SEQUENCE_CASES (allocation sequences) to {SEQUENCE_FIXTURE_DIR} instead")
    args = parser.parse_args(argv)
    cases = sequence_cases() if args.sequence else CASES
    if args.sequence and args.out == FIXTURE_DIR:
        args.out = SEQUENCE_FIXTURE_DIR
    if args.list:
        for name in cases:
            print(name)
        return 0
    if args.seed:
        warm_ops(("cpu_adam", "deepspeed_shm_comm"))
        if os.path.exists(SEED_FIXTURE) and not args.overwrite:
            print(f"seed: {SEED_FIXTURE} exists (use --overwrite)")
            return 0
        measurement = run_replay(seed_case(), timeout_s=args.timeout)
        save_fixture(measurement, SEED_FIXTURE, overwrite=args.overwrite)
        print(f"seed: {'ok' if measurement.ok else measurement.error.kind}, {measurement.wall_s:.1f} s -> {SEED_FIXTURE}")
        return 0 if measurement.ok else 1
    names = args.only or list(cases)
    unknown = [n for n in names if n not in cases]
    if unknown:
        parser.error(f"unknown cases: {', '.join(unknown)}")
    warm_ops()
    failed = 0
    for name in names:
        path = os.path.join(args.out, f"{name}.json")
        if os.path.exists(path) and not args.overwrite:
            print(f"{name}: {path} exists (use --overwrite)")
            continue
        measurement = run_replay(cases[name], timeout_s=args.timeout)
        save_fixture(measurement, path, overwrite=args.overwrite)
        status = "ok" if measurement.ok else f"{measurement.error.kind} in {measurement.error.phase}"
        failed += 0 if measurement.ok else 1
        print(f"{name}: {status}, {measurement.wall_s:.1f} s -> {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
