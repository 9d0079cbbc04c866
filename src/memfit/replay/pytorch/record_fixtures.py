"""Recorded replays of the non-DeepSpeed frameworks (plain torch loop, AMP, pure 16-bit, the Trainer's
optimizers, bitsandbytes, DDP, FSDP), and the command that records them.

``python -m memfit.replay.pytorch.record_fixtures [--out tests/fixtures/replay_torch] [--only NAME ...]
[--overwrite] [--list] [--examples] [--sequence]`` builds each case's scenario through ``build_scenario`` (the path ``memfit
plan`` takes), turns it into a ``ReplaySpec`` with ``spec_from_scenario`` and runs it with
``run_replay`` on this CPU; the ``Measurement`` is saved as ``<out>/<case>.json``.

Models are tiny Llama / GPT-2 configs (a few hundred thousand to a few million parameters,
sequence 64, micro-batch 2, 2 steps): small enough for a 2-core machine, shaped like the real
families (grouped-query attention, untied head; GPT-2 with its tied head).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

from memfit.replay.deepspeed.record_fixtures import TINY_LLAMA

FIXTURE_DIR = os.path.join("tests", "fixtures", "replay_torch")
TINY_GPT2: dict[str, Any] = {
    "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 128, "n_head": 4, "n_layer": 12,
    "n_positions": 256, "vocab_size": 1000, "bos_token_id": 0, "eos_token_id": 0,
}
"""GPT-2 shaped (Conv1D, tied head), 128 wide."""
LORA = {"lora_r": 4, "target_modules": "q_proj,v_proj"}
QLORA = {"method": "4bit", "quant_type": "nf4", "double_quant": True, "compute_dtype": "bf16"}
"""QLoRA's usual BitsAndBytesConfig."""

CASES: dict[str, dict[str, Any]] = {
    "llama_full_fp32_adamw": dict(precision="fp32", optim="adamw_torch"),
    "llama_full_ampbf16_adamw_foreach": dict(precision="amp_bf16", optim="adamw_torch_foreach"),
    "llama_full_bf16_fused": dict(precision="bf16", optim="adamw_torch_fused", load_dtype="bf16"),
    "llama_full_bf16_from_fp32_adamw": dict(precision="bf16", optim="adamw_torch"),
    "llama_full_fp32_adafactor": dict(precision="fp32", optim="adafactor"),
    "llama_full_ampbf16_paged_adamw_8bit": dict(precision="amp_bf16", optim="paged_adamw_8bit"),
    "llama_full_fp32_sgd_momentum": dict(precision="fp32", optim="sgd", optim_args={"momentum": 0.9}),
    "llama_full_fp32_lion_8bit": dict(precision="fp32", optim="lion_8bit"),
    "llama_full_fp32_adamw_ga2": dict(precision="fp32", optim="adamw_torch", grad_accum=2),
    "llama_lora_ampbf16_adamw": dict(precision="amp_bf16", optim="adamw_torch", peft_method="lora", peft_options=LORA),
    "llama_lora_ampbf16_bf16base_gc": dict(precision="amp_bf16", optim="adamw_torch", peft_method="lora",
                                           peft_options=LORA, load_dtype="bf16", gradient_checkpointing=True),
    "llama_full_ampfp16_adamw": dict(precision="amp_fp16", optim="adamw_torch"),
    "gpt2_full_fp32_adamw_tied": dict(precision="fp32", optim="adamw_torch", model=TINY_GPT2),
    "llama_qlora_nf4dq_ampbf16_adamw": dict(precision="amp_bf16", optim="adamw_torch", peft_method="lora",
                                            peft_options=LORA, load_dtype="bf16", quantization=QLORA),
    "llama_qlora_nf4dq_bf16storage_paged8bit_gc": dict(
        precision="amp_bf16", optim="paged_adamw_8bit", peft_method="lora", peft_options=LORA, load_dtype="bf16",
        quantization={**QLORA, "quant_storage": "bf16"}, gradient_checkpointing=True),
    "llama_qlora_fp4_fp32compute": dict(precision="fp32", optim="adamw_torch", peft_method="lora", peft_options=LORA,
                                        load_dtype="bf16", quantization={"method": "4bit"}),
    "llama_lora_int8_ampbf16": dict(precision="amp_bf16", optim="adamw_torch", peft_method="lora", peft_options=LORA,
                                    load_dtype="bf16", quantization={"method": "8bit"}),
    "llama_ddp_w2_fp32_adamw": dict(precision="fp32", optim="adamw_torch", gpus="2x24GiB", launcher="fake"),
    "llama_ddp_w2_ampbf16_bucketview_findunused": dict(
        precision="amp_bf16", optim="adamw_torch", gpus="2x24GiB", launcher="fake",
        ddp={"gradient_as_bucket_view": True, "find_unused_parameters": True}),
    "llama_ddp_w2_lora_ga2": dict(precision="fp32", optim="adamw_torch", peft_method="lora", peft_options=LORA,
                                  gpus="2x24GiB", launcher="fake", grad_accum=2,
                                  ddp={"bucket_cap_mb": 1.0}),
    "llama_fsdp2_w2_fp32_adamw": dict(framework="fsdp2", precision="fp32", optim="adamw_torch", gpus="2x24GiB",
                                      fsdp={"sharding_strategy": "FULL_SHARD"}),
    "llama_fsdp2_w2_mpbf16": dict(framework="fsdp2", precision="fp32", optim="adamw_torch", gpus="2x24GiB",
                                  fsdp={"mixed_precision": "bf16"}),
    "llama_fsdp2_w2_lora": dict(framework="fsdp2", precision="fp32", optim="adamw_torch", gpus="2x24GiB",
                                peft_method="lora", peft_options=LORA, fsdp={}),
    "llama_fsdp1_w2_fp32_adamw": dict(framework="fsdp", precision="fp32", optim="adamw_torch", gpus="2x24GiB",
                                      fsdp={"sharding_strategy": "FULL_SHARD"}, save="never"),
    "llama_fsdp1_w2_lora_shardgradop": dict(framework="fsdp", precision="fp32", optim="adamw_torch", gpus="2x24GiB",
                                            peft_method="lora", peft_options=LORA,
                                            fsdp={"sharding_strategy": "SHARD_GRAD_OP"}, save="never"),
}
"""Case name -> scenario inputs (besides the defaults below); ``launcher`` is the replay's."""

# FSDP1's full state dict crashes torch's fake process group (SIGSEGV in state_dict()): no save phase.
DEFAULTS = dict(seq_len=64, micro_batch=2, accelerator="cpu", gpus="1x24GiB", cpu_ram="64GB")
LAYERS = 4


def case_inputs(name: str, config_dir: str):
    """The ``ScenarioInputs`` of case ``name`` (its config.json written under ``config_dir``)."""
    from memfit.core.scenario.inputs import ScenarioInputs

    kw = dict(DEFAULTS)
    kw.update(CASES[name])
    kw.pop("launcher", None)
    kw.pop("save", None)
    cfg = kw.pop("model", TINY_LLAMA)
    path = os.path.join(config_dir, f"{cfg['model_type']}.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(cfg, fh)
    opts = kw.pop("peft_options", {})
    return ScenarioInputs(model=path, peft_options=opts, name=name, **kw)


def case_spec(name: str, *, layers: int = LAYERS, launcher: str | None = None):
    from memfit.core.scenario.build import build_scenario
    from memfit.replay.spec import spec_from_scenario

    with tempfile.TemporaryDirectory() as d:
        sc = build_scenario(case_inputs(name, d))
        from memfit.core.catalog import resolve_model_config

        cfg = resolve_model_config(sc.model_ref).config_dict() if os.path.exists(sc.model_ref) else None
        cfg = cfg or json.load(open(os.path.join(d, os.listdir(d)[0]), encoding="utf-8"))
        return spec_from_scenario(sc, model_config=cfg, layers=layers, steps=2, threads=1 if sc.world_size > 1 else 2,
                                  name=name, launcher=launcher or CASES[name].get("launcher", "fake"),
                                  save=CASES[name].get("save", "auto"))


SEQUENCE_CASES = ("llama_full_fp32_adamw", "llama_full_ampbf16_adamw_foreach", "llama_lora_ampbf16_bf16base_gc",
                  "llama_qlora_nf4dq_ampbf16_adamw", "llama_ddp_w2_fp32_adamw", "llama_fsdp1_w2_fp32_adamw",
                  "llama_fsdp2_w2_mpbf16")
"""The allocation-sequence cases (``--sequence``, to tests/fixtures/replay_sequence/ as ``<case>_seq``):
plain torch in fp32, AMP and LoRA with checkpointing, QLoRA, DDP, FSDP1, FSDP2, at the widths of
``memfit.replay.deepspeed.record_fixtures.MEDIUM`` (2 blocks, sequence 256 x micro-batch 2), keeping the
training loop's allocation sequence."""
SEQUENCE_EXAMPLES = ("lora-ampbf16-llama2-7b-1gpu",)
"""examples/frameworks/ replayed with their allocation sequence (``<example>_seq``)."""


def sequence_spec(name: str):
    """``case_spec(name)`` (or ``example_spec`` of an example) at the sequence cases' size."""
    import dataclasses

    from memfit.replay.deepspeed.record_fixtures import MEDIUM, SEQUENCE_SEQ_LEN

    spec = (example_spec(os.path.join(EXAMPLE_DIR, f"{name}.yaml")) if name in SEQUENCE_EXAMPLES
            else case_spec(name, layers=2))
    cfg = dict(spec.model_config)
    cfg.update({k: v for k, v in MEDIUM.items() if k in cfg})
    return dataclasses.replace(spec, name=f"{name}_seq", model_config=cfg, seq_len=SEQUENCE_SEQ_LEN, micro_batch=2,
                               alloc_sequence=True)


def record_sequences(out: str, only: list[str] | None, overwrite: bool) -> int:
    from memfit.replay.measurement import save_fixture
    from memfit.replay.runner import run_replay

    os.makedirs(out, exist_ok=True)
    failed = 0
    for name in (*SEQUENCE_CASES, *SEQUENCE_EXAMPLES):
        if only and name not in only and f"{name}_seq" not in only:
            continue
        path = os.path.join(out, f"{name}_seq.json")
        if os.path.exists(path) and not overwrite:
            print(f"{name}: kept {path}")
            continue
        m = run_replay(sequence_spec(name), timeout_s=900)
        if m.error is not None:
            failed += 1
            print(f"{name}: FAILED {m.error.kind} in {m.error.phase}: {m.error.message}", file=sys.stderr)
            continue
        save_fixture(m, path, overwrite=overwrite)
        print(f"{name}: {path} ({m.wall_s:.1f} s)")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    from memfit.replay.measurement import save_fixture
    from memfit.replay.runner import run_replay

    ap = argparse.ArgumentParser(prog="python -m memfit.replay.pytorch.record_fixtures")
    ap.add_argument("--out", default=FIXTURE_DIR)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--examples", action="store_true", help="replay examples/frameworks/*.yaml at a tiny size "
                    "into tests/fixtures/replay_examples instead")
    ap.add_argument("--sequence", action="store_true", help="record SEQUENCE_CASES (allocation sequences) into "
                    "tests/fixtures/replay_sequence instead")
    args = ap.parse_args(argv)
    if args.sequence:
        from memfit.replay.deepspeed.record_fixtures import SEQUENCE_FIXTURE_DIR

        return record_sequences(args.out if args.out != FIXTURE_DIR else SEQUENCE_FIXTURE_DIR, args.only, args.overwrite)
    if args.examples:
        return record_examples(args.out if args.out != FIXTURE_DIR else EXAMPLE_FIXTURE_DIR, args.only, args.overwrite)
    if args.list:
        print("\n".join(CASES))
        return 0
    os.makedirs(args.out, exist_ok=True)
    failed = 0
    for name in args.only or list(CASES):
        path = os.path.join(args.out, f"{name}.json")
        if os.path.exists(path) and not args.overwrite:
            print(f"{name}: kept {path}")
            continue
        m = run_replay(case_spec(name), timeout_s=900)
        if m.error is not None:
            failed += 1
            print(f"{name}: FAILED {m.error.kind} in {m.error.phase}: {m.error.message}\n{m.error.traceback[-2000:]}",
                  file=sys.stderr)
            continue
        save_fixture(m, path, overwrite=args.overwrite)
        print(f"{name}: {path} ({m.wall_s:.1f} s)")
    return 1 if failed else 0



# ---- the examples in examples/frameworks, replayed at a tiny size --------------------------------

EXAMPLE_DIR = os.path.join("examples", "frameworks")
EXAMPLE_FIXTURE_DIR = os.path.join("tests", "fixtures", "replay_examples")
EXAMPLE_NOTES = {
    "fsdp2-offload-llama3-8b-8gpu": "CPUOffloadPolicy needs an accelerator: the CPU replay shards without offload",
}


def tiny_of_family(model_type: str) -> dict[str, Any]:
    """A tiny config of the example model's family (same model_type and block structure)."""
    if model_type == "mistral":
        return {**TINY_LLAMA, "model_type": "mistral", "architectures": ["MistralForCausalLM"], "sliding_window": None}
    if model_type == "llama":
        return dict(TINY_LLAMA)
    raise ValueError(f"no tiny config for model_type {model_type!r}")


def example_spec(path: str, *, layers: int = 2):
    """The example's settings (framework, precision, optimizer, quantization, PEFT, input files) on a
    tiny model of its family: 2 blocks, sequence 64, micro-batch 2, at most 2 accumulation
    micro-steps, the example's world size in a fake world, on this CPU."""
    import dataclasses

    from memfit.core.catalog import resolve_model_config
    from memfit.core.frameworks.resolve import apply_input_files
    from memfit.core.hardware import parse_gpus
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.read import read_scenario_file
    from memfit.replay.spec import spec_from_scenario

    inputs = apply_input_files(read_scenario_file(path))
    model_type = resolve_model_config(inputs.model).config_dict()["model_type"]
    cfg = tiny_of_family(model_type)
    count, _ = parse_gpus(inputs.gpus or "1x24GiB")
    with tempfile.TemporaryDirectory() as d:
        cfg_path = os.path.join(d, "config.json")
        with open(cfg_path, "w", encoding="utf-8") as fh:
            json.dump(cfg, fh)
        fsdp = dict(inputs.fsdp) if inputs.fsdp else None
        if fsdp and fsdp.get("cpu_offload"):
            fsdp["cpu_offload"] = False
        fsdp = fsdp if fsdp is None else {**fsdp, "cpu_ram_efficient_loading": False}
        small = dataclasses.replace(
            inputs, model=cfg_path, seq_len=64, micro_batch=2, accelerator="cpu", gpus=f"{count}x24GiB",
            cpu_ram="64GB", nodes=1, grad_accum=min(inputs.grad_accum or 1, 2), fsdp=fsdp)
        sc = build_scenario(small)
    name = os.path.splitext(os.path.basename(path))[0]
    return spec_from_scenario(sc, model_config=cfg, layers=layers, steps=2, threads=1 if count > 1 else 2,
                              name=name, save="never" if sc.framework == "fsdp" else "auto")


def record_examples(out: str = EXAMPLE_FIXTURE_DIR, only: list[str] | None = None, overwrite: bool = False) -> int:
    from memfit.replay.measurement import save_fixture
    from memfit.replay.runner import run_replay

    os.makedirs(out, exist_ok=True)
    failed = 0
    for f in sorted(os.listdir(EXAMPLE_DIR)):
        stem, ext = os.path.splitext(f)
        if ext != ".yaml" or f.startswith("accelerate") or (only and stem not in only):
            continue
        path = os.path.join(out, f"{stem}.json")
        if os.path.exists(path) and not overwrite:
            continue
        m = run_replay(example_spec(os.path.join(EXAMPLE_DIR, f)), timeout_s=900)
        if m.error is not None:
            failed += 1
            print(f"{stem}: FAILED {m.error.kind} in {m.error.phase}: {m.error.message}", file=sys.stderr)
            continue
        save_fixture(m, path, overwrite=overwrite)
        print(f"{stem}: {path} ({m.wall_s:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
