"""The GPU validation kit's cases, each run in its own process by ``memfit.recording.gpu_kit``.

``python -m memfit.recording.kit_cases CASE OUT_DIR [--dry-run]`` runs one case under
``memfit.record`` (snapshot on, on CUDA) and writes into OUT_DIR: ``stats.rank0.json``,
``snapshot.rank0.pickle`` (CUDA), ``case.json`` (what ran: the replay spec or the parameters, the
DeepSpeed JSON used, DeepSpeed's buffer sizes read off its objects, the CUDA context measured, the
allocator sequence and its counters for the allocator cases, the error if it failed).

On CUDA the sizes are real (the seed at 2 layers and at full size, Llama-2-7b at 2 layers); with
``--dry-run`` the same code runs on the CPU with tiny configs (the replay fixtures' 128-wide GPT-J
and Llama), so the kit cannot rot: tests/recording/test_gpu_kit.py runs it in CI.

DeepSpeed cases run the replay's own recipe (``memfit.replay.deepspeed.child.ChildRun``: model from config,
peft, ``deepspeed.initialize`` cut into phases by ``memfit.replay.deepspeed.seams``, steps on random tokens,
the 16-bit save) on rank 0 of a fake 2-rank world (``memfit.replay.fake_world``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
SEED_YAML = ROOT / "examples" / "kogpt-prefix-zero3-offload.yaml"
RTX3090_BYTES = 25_438_126_080
"""The 24 GB card the seed ran on, as torch reports its capacity (memfit.core.hardware GPU_PRESETS)."""


@dataclass(frozen=True)
class KitCase:
    name: str
    kind: str
    """``deepspeed``, ``lora``, ``qlora``, ``amp``, ``fsdp2``, ``alloc_device`` or ``alloc_pinned``."""
    what: str
    timeout_s: int
    params: dict[str, Any] = field(default_factory=dict)


CASES: tuple[KitCase, ...] = (
    KitCase("alloc_device", "alloc_device", "raw device tensors of chosen sizes: the caching allocator's rounding, pools, "
            "splitting, reuse, empty_cache, a side stream", 60, {}),
    KitCase("alloc_pinned", "alloc_pinned", "raw pinned host tensors of chosen sizes: the pinned allocator's rounding and "
            "caching", 60, {}),
    KitCase("seed_2layers", "deepspeed", "the seed (kogpt prefix tuning, its ZeRO-3 + offload JSON verbatim), 2 layers, "
            "rank 0 of 2", 240, {"model": "seed", "layers": 2}),
    KitCase("seed_full_24gb", "deepspeed", "the seed at full size (28 layers) on the H200 capped to an RTX 3090 "
            "(set_per_process_memory_fraction)", 420, {"model": "seed", "layers": None, "cap": "rtx3090"}),
    KitCase("zero2_w2", "deepspeed", "Llama-2-7b shapes, 2 layers, full fine-tuning, ZeRO-2, rank 0 of 2", 180,
            {"model": "llama", "stage": 2, "offload": False}),
    KitCase("zero2_offload_w2", "deepspeed", "as zero2_w2 with the optimizer offloaded to pinned CPU memory", 180,
            {"model": "llama", "stage": 2, "offload": True}),
    KitCase("zero3_w2", "deepspeed", "Llama-2-7b shapes, 2 layers, full fine-tuning, ZeRO-3, rank 0 of 2", 180,
            {"model": "llama", "stage": 3, "offload": False}),
    KitCase("zero3_offload_w2", "deepspeed", "as zero3_w2 with params and optimizer offloaded to pinned CPU memory", 180,
            {"model": "llama", "stage": 3, "offload": True}),
    KitCase("lora_1gpu", "lora", "LoRA r=16 on Llama-2-7b shapes (2 layers, bf16), torch AdamW, one GPU", 120, {}),
    KitCase("qlora_1gpu", "qlora", "QLoRA: bitsandbytes nf4 4-bit base (from_pretrained), LoRA r=16, one GPU", 150, {}),
    KitCase("amp_1gpu", "amp", "plain AMP: fp16 autocast + GradScaler, full fine-tuning, one GPU", 120, {}),
    KitCase("fsdp2_fake_w2", "fsdp2", "FSDP2 (fully_shard per layer + root, bf16 params) on rank 0 of a fake 2-rank world",
            150, {}),
)
"""In run order: the cheap allocator sequences first (the simulators' checks are never cut by the time
budget), the full-size seed after the 2-layer one (cpu_adam is built by then)."""
BY_NAME = {c.name: c for c in CASES}

DEVICE_SEQUENCE: tuple[tuple[str, int], ...] = (
    ("alloc", 4), ("alloc", 1_048_576), ("alloc", 1_048_577), ("alloc", 5_000_000), ("alloc", 12_000_000),
    ("alloc", 30_000_000), ("free", 3), ("alloc", 4_000_000), ("alloc", 200 * 2**20), ("free", 8),
    ("alloc", 150 * 2**20), ("alloc", 60 * 2**20), ("free", 0), ("free", 1), ("side_stream", 64 * 2**20),
    ("empty_cache", 0), ("alloc", 2**30), ("free", 16),
)
"""(op, size or index of the allocation to free). Each op is one phase; the snapshot records the rest."""
PINNED_SEQUENCE: tuple[tuple[str, int], ...] = (
    ("alloc", 1), ("alloc", 4096), ("alloc", 1_048_577), ("alloc", 3 * 2**20), ("alloc", 100_000_000),
    ("free", 4), ("alloc", 70_000_000), ("alloc", 2**27 + 1), ("free", 2), ("alloc", 1_500_000),
)
"""Pinned requests: torch >= 1.11 rounds each up to a power of two and caches freed blocks per size."""


@dataclass
class KitContext:
    case: KitCase
    out: Path
    dry: bool
    device: str
    info: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------- DeepSpeed

class _PhaseAdapter:
    """What ``ChildRun._run`` and ``memfit.replay.deepspeed.seams`` call (``enter``), forwarded to the recorder."""

    def __init__(self, rec) -> None:
        self.rec = rec

    def enter(self, name: str, *, step: int | None = None, micro_step: int | None = None) -> None:
        self.rec.mark(name, step=None if step is None else step + 1, micro_step=None if micro_step is None else micro_step + 1)


class _NoHostTracker:
    def note_pinned(self, tensor) -> None:  # pinned bytes come from host_memory_stats here
        return None


def deepspeed_spec(ctx: KitContext):
    from memfit.core.peft.spec import PeftSpec
    from memfit.replay.deepspeed.record_fixtures import SEED_PREFIX, TINY_GPTJ, TINY_LLAMA, deepspeed_json
    from memfit.replay.spec import ReplaySpec, spec_from_scenario

    p = ctx.case.params
    if p["model"] == "seed":
        if ctx.dry:
            return ReplaySpec(name=ctx.case.name, model_config=TINY_GPTJ, layers=1, peft=SEED_PREFIX,
                              deepspeed_config=deepspeed_json(3, offload=True), world_size=2, seq_len=32, steps=2,
                              accelerator="cpu", threads=2, host_tracker=False)
        from memfit.core.scenario.build import build_scenario
        from memfit.core.scenario.inputs import ScenarioInputs, merge_inputs
        from memfit.core.scenario.read import read_scenario_file

        sc = build_scenario(merge_inputs(read_scenario_file(SEED_YAML), ScenarioInputs(ds_version="0.19")))
        cap = None
        if p.get("cap") == "rtx3090":
            cap = RTX3090_BYTES - ctx.info["cuda_context_bytes"]
            ctx.info["cap_note"] = (f"allocator capped at {cap:,} B: an RTX 3090's {RTX3090_BYTES:,} B minus the CUDA context "
                                    f"measured here ({ctx.info['cuda_context_bytes']:,} B)")
        return spec_from_scenario(sc, layers=p["layers"], accelerator="cuda", world_size=2, emulate_capacity_bytes=cap,
                                  steps=2, name=ctx.case.name, host_tracker=False)
    ds = deepspeed_json(p["stage"], offload=p["offload"])
    if not ctx.dry:  # DeepSpeed's default buckets on a GPU (the small ones keep CPU replays light)
        for key in ("reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size",
                    "stage3_param_persistence_threshold"):
            ds["zero_optimization"].pop(key, None)
        from memfit.core.catalog import resolve_model_config

        model = resolve_model_config("meta-llama/Llama-2-7b-hf").config_dict()
    else:
        model = TINY_LLAMA
    return ReplaySpec(name=ctx.case.name, model_config=model, layers=2, peft=PeftSpec(method="full"), deepspeed_config=ds,
                      world_size=2, seq_len=32 if ctx.dry else 512, steps=2, accelerator=ctx.device,
                      threads=2 if ctx.dry else None, host_tracker=False)


def run_deepspeed(ctx: KitContext, rec) -> None:
    from memfit.replay.deepspeed.child import ChildRun, launcher_env

    spec = deepspeed_spec(ctx)
    os.environ.update(launcher_env(spec))
    import torch

    if spec.emulate_capacity_bytes:
        total = torch.cuda.mem_get_info(0)[1]
        torch.cuda.set_per_process_memory_fraction(min(1.0, spec.emulate_capacity_bytes / total), 0)
    ctx.info["spec"] = spec.to_dict()
    run = ChildRun(spec, progress_path=None, command="memfit gpu kit")
    try:
        run._run(_PhaseAdapter(rec), _NoHostTracker())
    finally:
        ctx.info.update(deepspeed_config_used=run.ds_config, substitutions=list(run.substitutions), notes=list(run.notes),
                        losses=list(run.losses), skipped_steps=run.skipped_steps,
                        items=[dataclasses.asdict(i) for i in run.items])


# --------------------------------------------------------------------------- plain torch loops

def _llama_config(ctx: KitContext) -> dict[str, Any]:
    from memfit.replay.deepspeed.record_fixtures import TINY_LLAMA

    if ctx.dry:
        return dict(TINY_LLAMA, num_hidden_layers=2)
    from memfit.core.catalog import resolve_model_config
    from memfit.replay.spec import override_layers

    return override_layers(resolve_model_config("meta-llama/Llama-2-7b-hf").config_dict(), 2)


def _train(ctx: KitContext, rec, model, params, *, steps: int = 2, autocast=None, scaler=None, opt=None) -> None:
    """``setup`` (the optimizer, unless the caller made it in its own setup), then ``steps`` steps of
    forward / backward / optimizer_step on random tokens (batch 1)."""
    import torch

    vocab = int(model.config.vocab_size)
    seq = 32 if ctx.dry else 512
    gen = torch.Generator().manual_seed(0)
    if opt is None:
        with rec.phase("setup"):
            opt = torch.optim.AdamW(params, lr=1e-4)
    losses = []
    for _ in range(steps):
        ids = torch.randint(0, vocab, (1, seq), generator=gen).to(ctx.device)
        with rec.phase("forward"):
            if autocast is not None:
                with torch.autocast(device_type=ctx.device, dtype=autocast):
                    loss = model(input_ids=ids, labels=ids).loss
            else:
                loss = model(input_ids=ids, labels=ids).loss
        with rec.phase("backward"):
            (scaler.scale(loss) if scaler is not None else loss).backward()
        with rec.phase("optimizer_step"):
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach().float().cpu()))
        del loss
    ctx.info["losses"] = losses


def run_lora(ctx: KitContext, rec) -> None:
    import torch

    from memfit.core.peft.spec import PeftSpec
    from memfit.replay.model_build import apply_peft, build_model

    spec = PeftSpec(method="lora", lora_r=4 if ctx.dry else 16, lora_alpha=8 if ctx.dry else 32,
                    target_modules=("q_proj", "v_proj"))
    ctx.info["peft"] = dataclasses.asdict(spec)
    with rec.phase("load"):
        model = build_model(_llama_config(ctx), dtype="bf16").to(ctx.device)
        model = apply_peft(model, spec)
    torch.manual_seed(0)
    _train(ctx, rec, model, [p for p in model.parameters() if p.requires_grad])


def run_qlora(ctx: KitContext, rec) -> None:
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    import peft

    from memfit.replay.model_build import build_model

    tmp = tempfile.mkdtemp(prefix="memfit-kit-qlora-")
    build_model(_llama_config(ctx), dtype="bf16").save_pretrained(tmp)  # the checkpoint from_pretrained quantizes
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
    with rec.phase("load"):
        model = AutoModelForCausalLM.from_pretrained(tmp, quantization_config=quant, device_map={"": ctx.device})
        model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        model = peft.get_peft_model(model, peft.LoraConfig(r=4 if ctx.dry else 16, lora_alpha=32,
                                                           target_modules=["q_proj", "v_proj"]))
    ctx.info["quantization"] = quant.to_dict()
    _train(ctx, rec, model, [p for p in model.parameters() if p.requires_grad])


def run_amp(ctx: KitContext, rec) -> None:
    import torch

    from memfit.replay.model_build import build_model

    with rec.phase("load"):
        model = build_model(_llama_config(ctx), dtype="fp32").to(ctx.device)
    dtype = torch.bfloat16 if ctx.dry else torch.float16
    ctx.info["autocast_dtype"] = str(dtype) + (" (the CPU dry run autocasts to bf16)" if ctx.dry else "")
    scaler = torch.amp.GradScaler(ctx.device, enabled=not ctx.dry)
    _train(ctx, rec, model, list(model.parameters()), autocast=dtype, scaler=scaler)


def run_fsdp2(ctx: KitContext, rec) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from memfit.replay.model_build import build_model

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    mesh = init_device_mesh(ctx.device, (2,))
    with rec.phase("load"):
        model = build_model(_llama_config(ctx), dtype="fp32")
    with rec.phase("setup"):
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        model.to(ctx.device)  # fully_shard already moved the shards to the mesh device
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ctx.info["fsdp2"] = "fully_shard per decoder layer and the root, bf16 params, fp32 reduce, fake world of 2"
    _train(ctx, rec, model, None, opt=opt)
    dist.destroy_process_group()


# -------------------------------------------------------------------------- raw allocator ops

def run_alloc_device(ctx: KitContext, rec) -> None:
    import torch

    live: dict[int, Any] = {}
    counters = []
    for i, (op, n) in enumerate(DEVICE_SEQUENCE):
        with rec.phase(f"op{i:02d}.{op}"):
            if op == "alloc":
                live[i] = torch.empty(n, dtype=torch.uint8, device=ctx.device)
            elif op == "free":
                del live[n]
            elif op == "side_stream" and ctx.device == "cuda":
                side = torch.cuda.Stream()
                with torch.cuda.stream(side):
                    t = torch.empty(n, dtype=torch.uint8, device="cuda")
                    t.fill_(1)
                t.record_stream(torch.cuda.current_stream())
                del t
            elif op == "empty_cache" and ctx.device == "cuda":
                torch.cuda.empty_cache()
        if ctx.device == "cuda":
            torch.cuda.synchronize()
            ms = torch.cuda.memory_stats()
            counters.append({"op": op, "size_or_index": n, "allocated_bytes": int(ms["allocated_bytes.all.current"]),
                             "requested_bytes": int(ms.get("requested_bytes.all.current", 0)),
                             "reserved_bytes": int(ms["reserved_bytes.all.current"])})
    ctx.info["sequence"] = [list(x) for x in DEVICE_SEQUENCE]
    ctx.info["counters"] = counters


def run_alloc_pinned(ctx: KitContext, rec) -> None:
    import torch

    pin = ctx.device == "cuda"
    live: dict[int, Any] = {}
    counters = []
    for i, (op, n) in enumerate(PINNED_SEQUENCE):
        with rec.phase(f"op{i:02d}.{op}"):
            if op == "alloc":
                live[i] = torch.empty(n, dtype=torch.uint8, pin_memory=pin)
            else:
                del live[n]
        if pin:
            hs = torch.cuda.host_memory_stats()
            counters.append({"op": op, "size_or_index": n,
                             "held_bytes": int(hs.get("allocated_bytes.current", hs.get("allocated_bytes.all.current", 0))),
                             "in_use_bytes": int(hs.get("active_bytes.current", hs.get("active_bytes.all.current", 0)))})
    ctx.info["sequence"] = [list(x) for x in PINNED_SEQUENCE]
    ctx.info["counters"] = counters
    if not pin:
        ctx.info["note"] = "dry run: pageable tensors (pin_memory needs CUDA); the same sizes and order"


RUNNERS = {"deepspeed": run_deepspeed, "lora": run_lora, "qlora": run_qlora, "amp": run_amp, "fsdp2": run_fsdp2,
           "alloc_device": run_alloc_device, "alloc_pinned": run_alloc_pinned}


def run_case(name: str, out: Path, *, dry: bool) -> int:
    """Run one case into ``out`` (exists, empty); 0 on success, 1 when the case failed (recorded)."""
    case = BY_NAME[name]
    device = "cpu" if dry else "cuda"
    if dry:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch

    from memfit.recording.recorder import Recorder

    torch.manual_seed(0)
    ctx = KitContext(case=case, out=out, dry=dry, device=device)
    t0 = time.perf_counter()
    if device == "cuda":
        torch.cuda.init()
        free, total = torch.cuda.mem_get_info(0)
        ctx.info.update(device_name=torch.cuda.get_device_name(0), device_total_bytes=int(total),
                        cuda_context_bytes=int(total - free - torch.cuda.memory_reserved(0)))
    error = None
    try:
        with Recorder(out, snapshot=device == "cuda", device=device) as rec:
            RUNNERS[case.kind](ctx, rec)
    except Exception as exc:  # noqa: BLE001 - a failed case is a result (an OOM is a finding)
        import traceback

        error = {"type": type(exc).__name__, "message": str(exc)[:2000], "traceback": traceback.format_exc()[-4000:]}
    ctx.info.update(case=case.name, kind=case.kind, what=case.what, dry_run=dry, device=device,
                    wall_s=round(time.perf_counter() - t0, 3), error=error, python=sys.version.split()[0],
                    torch=torch.__version__)
    from memfit.core.writing import write_file

    write_file(out / "case.json", json.dumps(ctx.info, indent=1, default=str) + "\n", what="gpu kit")
    return 0 if error is None else 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    dry = "--dry-run" in argv
    args = [a for a in argv if a != "--dry-run"]
    if len(args) != 2 or args[0] not in BY_NAME:
        print(f"usage: python -m memfit.recording.kit_cases CASE OUT_DIR [--dry-run]; CASE in {', '.join(BY_NAME)}",
              file=sys.stderr)
        return 2
    out = Path(args[1])
    out.mkdir(parents=True, exist_ok=True)
    return run_case(args[0], out, dry=dry)


if __name__ == "__main__":
    sys.exit(main())
