"""The ``memfit`` command line. One function per command; heavy imports stay inside them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from memfit.errors import MemfitError

app = typer.Typer(
    name="memfit",
    help=("Will this training run fit in GPU and CPU memory? memfit replays the training library's allocations "
          "on paper (DeepSpeed, plain PyTorch / the Trainer, DDP, FSDP/FSDP2, bitsandbytes QLoRA), phase by phase "
          "(load, initialize or setup, forward, backward, optimizer step, steady-state step 2, save), through "
          "simulations of PyTorch's caching and pinned allocators; says which phase fails first and why, and "
          "checks its numbers against real runs. Sizes: GiB = 2^30 bytes, GB = 10^9."),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _console(stderr: bool = False):
    """Console for every command's output. ``markup=False``: a scenario name, model or path that
    looks like rich markup (``[/bold]``) is printed as written, never interpreted."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, markup=False)


def _warn_inputs(sc) -> None:
    """Print what memfit resolved or DeepSpeed would ignore in the inputs, one line each, on stderr
    (the plan's findings carry them too)."""
    for w in sc.deepspeed.warnings:
        print(f"memfit: warning: {w}", file=sys.stderr)


@app.command()
def plan(
    scenario: Optional[Path] = typer.Argument(None, help="Scenario YAML file (see examples/). Flags override it."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Catalog name (see `memfit models`), Hugging Face id, directory or config.json."),
    peft: Optional[str] = typer.Option(None, "--peft", help="full | prefix | prompt | lora | freeze | path to a PEFT adapter_config.json."),
    num_virtual_tokens: Optional[int] = typer.Option(None, help="prefix/prompt: virtual tokens."),
    prefix_projection: Optional[bool] = typer.Option(None, "--prefix-projection/--no-prefix-projection", help="prefix: reparameterize through an MLP encoder."),
    encoder_hidden_size: Optional[int] = typer.Option(None, help="prefix with projection: encoder MLP width."),
    lora_r: Optional[int] = typer.Option(None, help="lora: rank r."),
    target_modules: Optional[str] = typer.Option(None, help="lora: comma-separated module names, or all-linear (default: peft's for the model)."),
    lora_bias: Optional[str] = typer.Option(None, help="lora: none | all | lora_only."),
    freeze: Optional[str] = typer.Option(None, help="freeze: comma-separated glob patterns of parameter names to freeze."),
    deepspeed: Optional[Path] = typer.Option(None, "--deepspeed", "-d", help="Your DeepSpeed config JSON (\"auto\" values are resolved as the HF Trainer does)."),
    deepspeed_version: Optional[str] = typer.Option(None, help="Allocation behaviour to model: 0.19 (current, default), 0.6 or 0.5 (early 2022)."),
    gpus: Optional[str] = typer.Option(None, "--gpus", "-g", help="GPUs per node, e.g. 2xrtx3090, 8xa100-80gb, 2x24GiB (default 1xa100-80gb)."),
    nodes: Optional[int] = typer.Option(None, help="Number of nodes."),
    cpu_ram: Optional[str] = typer.Option(None, help="Host RAM per node, e.g. 64GB or 256GiB (default 256GB)."),
    nvme: Optional[str] = typer.Option(None, help="Free NVMe space per node for offload, e.g. 2TB."),
    load_dtype: Optional[str] = typer.Option(None, help="from_pretrained torch_dtype: fp32 (its default), fp16 or bf16."),
    zero_init: Optional[bool] = typer.Option(None, "--zero-init/--no-zero-init", help="Model built under deepspeed.zero.Init (or HfDeepSpeedConfig created before from_pretrained)."),
    low_cpu_mem_usage: Optional[bool] = typer.Option(None, "--low-cpu-mem-usage/--no-low-cpu-mem-usage", help="from_pretrained without a second host copy (default on)."),
    checkpoint_index: Optional[Path] = typer.Option(None, "--checkpoint-index", help="The checkpoint's model.safetensors.index.json: its shards are loaded one at a time."),
    max_shard_size: Optional[str] = typer.Option(None, "--max-shard-size", help="The checkpoint's shard size, e.g. 5GB (default: that of the transformers version that saved it)."),
    seq_len: Optional[int] = typer.Option(None, help="Sequence length (default 2048)."),
    micro_batch: Optional[int] = typer.Option(None, help="Micro-batch per GPU (default: the DeepSpeed config's train_micro_batch_size_per_gpu)."),
    grad_accum: Optional[int] = typer.Option(None, "--grad-accum", help="Gradient accumulation steps: fills \"auto\" in a DeepSpeed config (the Trainer's --gradient_accumulation_steps); without one, sets it (default 1)."),
    precision: Optional[str] = typer.Option(None, "--precision", help="With DeepSpeed: fp16 | bf16 | fp32 (the Trainer's --fp16/--bf16), filling \"auto\" in the config's fp16/bf16 sections (default: bf16 if the GPU supports it, else fp16). Outside DeepSpeed: fp32 | amp_fp16 | amp_bf16 (autocast, fp32 weights) | fp16 | bf16 (pure 16-bit model, gradients and optimizer states)."),
    gradient_checkpointing: Optional[bool] = typer.Option(None, "--gradient-checkpointing/--no-gradient-checkpointing", help="Activation checkpointing of each layer."),
    model_parameters: Optional[str] = typer.Option(None, help="What the script passes to deepspeed.initialize(model_parameters=...): trainable (default) or all."),
    accelerator: Optional[str] = typer.Option(None, help="cuda (default) or cpu (DeepSpeed's CPU accelerator, as CPU replays run)."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="Allow configs whose model needs remote code (never on by default)."),
    attention: Optional[str] = typer.Option(None, help="attn_implementation: eager, sdpa, flash_attention_2, flash_attention_3 or flex_attention (default: transformers' choice for the model, sdpa where supported)."),
    task: Optional[str] = typer.Option(None, "--task", help="Head to plan: causal-lm, masked-lm, seq2seq-lm, sequence-classification, token-classification, question-answering (default: the config's architectures)."),
    target_len: Optional[int] = typer.Option(None, "--target-len", help="Encoder-decoder models: decoder tokens per sequence (--seq-len is the encoder's; default: the same)."),
    lengths: Optional[Path] = typer.Option(None, "--lengths", help="File of token counts per sample (one per line), or a histogram (length,count lines or JSON): plan the largest batch the batching forms."),
    batching: Optional[str] = typer.Option(None, "--batching", help="With --lengths: pad-longest (default: each batch padded to its longest sample), bucket (group_by_length) or pack (rows of --max-seq-length)."),
    max_seq_length: Optional[int] = typer.Option(None, "--max-seq-length", help="With --lengths: truncation length, and the row length of --batching pack."),
    torch_version: Optional[str] = typer.Option(None, "--torch-version", help="torch release whose allocator rules apply, e.g. 2.13 (default) or 1.10 (pinned blocks not rounded to powers of two)."),
    alloc_conf: Optional[str] = typer.Option(None, "--alloc-conf", help="PYTORCH_CUDA_ALLOC_CONF of the run, e.g. expandable_segments:True (checked against that torch version)."),
    alloc_conf_from_env: bool = typer.Option(False, "--alloc-conf-from-env", help="Read PYTORCH_CUDA_ALLOC_CONF (then PYTORCH_ALLOC_CONF) from this environment; never done unless asked."),
    cuda_version: Optional[str] = typer.Option(None, "--cuda-version", help="CUDA of the torch build, e.g. 12.8 (default: the usual one for that torch); lazy kernel loading needs >= 11.7."),
    pin_memory_backend: Optional[str] = typer.Option(None, "--pin-memory-backend", help="DeepSpeed 0.19's DS_PIN_MEMORY_BACKEND: torch (default) or native (mlock, no torch cache)."),
    dataloader_workers: Optional[int] = typer.Option(None, "--dataloader-workers", help="DataLoader num_workers per rank (forked processes: their host memory; default 0)."),
    dataset_tokens: Optional[int] = typer.Option(None, "--dataset-tokens", help="Tokens of the tokenized dataset held in host memory (default: not counted)."),
    framework: Optional[str] = typer.Option(None, "--framework", help="deepspeed | torch (one GPU: a plain loop or the HF Trainer) | ddp | fsdp | fsdp2 (default: inferred; a DeepSpeed JSON means deepspeed)."),
    optim: Optional[str] = typer.Option(None, "--optim", help="Outside DeepSpeed: the Trainer's optim string (adamw_torch, adamw_torch_fused, adafactor, sgd, adamw_bnb_8bit, paged_adamw_8bit, paged_adamw_32bit, lion_32bit, lion_8bit, ...)."),
    training_args: Optional[Path] = typer.Option(None, "--training-args", help="A Hugging Face TrainingArguments or TRL SFTConfig as JSON/YAML: batch size, accumulation, checkpointing, bf16/fp16, optim, max_length, fsdp, deepspeed."),
    bnb_config: Optional[Path] = typer.Option(None, "--bnb-config", help="A BitsAndBytesConfig as JSON (or a config.json with a quantization_config)."),
    accelerate_config: Optional[Path] = typer.Option(None, "--accelerate-config", help="An accelerate config YAML (distributed_type, mixed_precision, num_processes, fsdp_config, deepspeed_config)."),
    quantization: Optional[str] = typer.Option(None, "--quantization", help="bitsandbytes quantization of the base model: none | 4bit | 8bit (4bit: nf4 + double quant + bf16 compute, QLoRA's usual; give a BitsAndBytesConfig for other settings)."),
    report: Optional[Path] = typer.Option(None, "--report", help="Also write a report: .html (charts, self-contained) or .md. Never overwrites a file."),
    exact: bool = typer.Option(False, "--exact", help="Trace forward/backward from the model's code (needs torch, transformers, peft; seconds) instead of the analytic activation estimate."),
    json_out: bool = typer.Option(False, "--json", help="Print the plan as JSON (schema: docs/json-schema.md)."),
    all_items: bool = typer.Option(False, "--all-items", help="Show every phase's ledger items, not only the peaks'."),
) -> None:
    """Phase-by-phase memory ledger, verdict and findings for one scenario.

    Activations are analytic unless --exact is given (then traced with torch's FakeTensorMode, no GPU
    needed); everything DeepSpeed allocates is computed from its code either way.
    """
    from memfit.core.plan import make_plan
    from memfit.core.scenario.read import ScenarioInputs, build_scenario, merge_inputs, read_scenario_file

    options = {k: v for k, v in dict(num_virtual_tokens=num_virtual_tokens, prefix_projection=prefix_projection,
                                    encoder_hidden_size=encoder_hidden_size, lora_r=lora_r,
                                    target_modules=target_modules, lora_bias=lora_bias,
                                    freeze_patterns=freeze).items() if v is not None}
    flags = ScenarioInputs(
        model=model, peft_method=peft, peft_options=options,
        deepspeed=str(deepspeed) if deepspeed else None, ds_version=deepspeed_version, gpus=gpus, nodes=nodes,
        cpu_ram=cpu_ram, nvme=nvme, load_dtype=load_dtype, zero_init=zero_init, low_cpu_mem_usage=low_cpu_mem_usage,
        checkpoint_index=str(checkpoint_index) if checkpoint_index else None, max_shard_size=max_shard_size,
        seq_len=seq_len, micro_batch=micro_batch, gradient_checkpointing=gradient_checkpointing,
        model_parameters=model_parameters, accelerator=accelerator, trust_remote_code=trust_remote_code or None,
        attention=attention, torch_version=torch_version, alloc_conf=alloc_conf,
        alloc_conf_from_env=alloc_conf_from_env or None, cuda_version=cuda_version, pin_memory_backend=pin_memory_backend,
        dataloader_workers=dataloader_workers, dataset_tokens=dataset_tokens,
        task=task, target_len=target_len, lengths=str(lengths) if lengths else None,
        batching=batching, max_seq_length=max_seq_length,
        framework=framework, precision=precision, optim=optim, grad_accum=grad_accum,
        quantization=_quant_flag(quantization),
        training_args=str(training_args) if training_args else None, bnb_config=str(bnb_config) if bnb_config else None,
        accelerate_config=str(accelerate_config) if accelerate_config else None,
    )
    inputs = merge_inputs(read_scenario_file(scenario), flags) if scenario else flags
    sc = build_scenario(inputs)
    _warn_inputs(sc)
    if report is not None:
        _check_report_path(report)  # before any work: a bad path fails fast
    traced = None
    if sc.model.source == "meta" and not exact:  # no pure builder: its activations come from a trace
        for note in sc.model.notes:
            _console(stderr=True).print(f"memfit: {note}")
        exact = True
    if exact:
        from memfit.trace.ledger_step import ledger_step

        traced = ledger_step(sc, _trace_with_progress(sc))
    result = make_plan(sc, traced)
    if report is not None:
        _write_report(report, result, sc)
    if json_out:
        import json

        from memfit.render.json_out import plan_to_dict
        from memfit.core.scenario.read import describe_scenario

        typer.echo(json.dumps(plan_to_dict(result, scenario=describe_scenario(sc)), indent=2))
        return
    from memfit.render.terminal import render_plan

    render_plan(result, sc, _console(), all_items=all_items)


def _quant_flag(value: Optional[str]) -> Optional[dict]:
    """``--quantization``: ``4bit`` is QLoRA's usual BitsAndBytesConfig (nf4, double quant, bf16 compute)."""
    if value is None:
        return None
    if value == "4bit":
        return {"method": "4bit", "quant_type": "nf4", "double_quant": True, "compute_dtype": "bf16"}
    if value in ("8bit", "none"):
        return {"method": value}
    raise MemfitError(f"--quantization must be none, 4bit or 8bit, got {value!r}")


def _check_report_path(path: Path) -> str:
    import os

    suffix = path.suffix.lower()
    if suffix not in (".html", ".htm", ".md"):
        raise MemfitError(f"--report: give a .html or .md path, got {path}")
    try:
        if os.path.lexists(path):  # a dangling symlink too: never written through
            raise MemfitError(f"--report: {path} exists; memfit never overwrites a file (choose another name)")
        if not path.parent.is_dir():
            raise MemfitError(f"--report: {path.parent} is not a directory")
    except OSError as e:
        raise MemfitError(f"--report: cannot use {path}: {e.strerror or type(e).__name__}") from None
    return suffix


def write_new_file(path: Path, text: str, *, what: str) -> None:
    """Create ``path`` and write ``text``, never replacing anything: ``O_EXCL`` fails on any existing
    entry, a dangling symlink included, and ``O_NOFOLLOW`` refuses a link in the last component."""
    import os

    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except FileExistsError:
        raise MemfitError(f"{what}: {path} exists; memfit never overwrites a file (choose another name)") from None
    except OSError as e:
        raise MemfitError(f"{what}: cannot create {path}: {e.strerror or type(e).__name__}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise MemfitError(f"{what}: cannot write {path}: {e.strerror or type(e).__name__}") from None


def _write_report(path: Path, result, sc, *, title: str | None = None, render=None, heading: str = "") -> None:
    """Write the plan's report; ``render(console)`` (a terminal renderer) adds a section first."""
    from memfit.render.report import html_report, markdown_report, rich_fragment, section_page

    suffix = _check_report_path(path)
    html_sections, text_sections = (), ()
    if render is not None:
        html, text = rich_fragment(render)
        html_sections, text_sections = ((heading, html),), ((heading, text),)
    if suffix == ".md":
        out = markdown_report(result, sc, sections=text_sections, title=title)
    elif result is None:
        out = section_page(title or "memfit", html_sections)
    else:
        out = html_report(result, sc, sections=html_sections, title=title)
    write_new_file(path, out, what="--report")
    _console(stderr=True).print(f"report written to {path}")


def _trace_with_progress(sc):
    """Run the trace with a progress display on stderr (the trace takes seconds to a minute)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from memfit.trace.ledger_step import trace_scenario

    with Progress(TextColumn("{task.description}", style="progress.description", markup=False), BarColumn(), TimeElapsedColumn(),
                  console=_console(stderr=True), transient=True) as bar:
        tasks: dict[str, int] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(f"tracing: {stage}", total=max(total, 1))
            bar.update(tasks[stage], completed=done, total=max(total, 1))

        return trace_scenario(sc, progress=progress)


@app.command()
def trace(
    scenario: Optional[Path] = typer.Argument(None, help="Scenario YAML file (see examples/). Flags override it."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Catalog name, Hugging Face id, directory or config.json."),
    peft: Optional[str] = typer.Option(None, "--peft", help="full | prefix | prompt | lora | freeze | adapter_config.json."),
    deepspeed: Optional[Path] = typer.Option(None, "--deepspeed", "-d", help="DeepSpeed JSON (precision, ZeRO-3 gathering)."),
    gpus: Optional[str] = typer.Option(None, "--gpus", "-g", help="e.g. 2xrtx3090 (world size for ZeRO-3)."),
    seq_len: Optional[int] = typer.Option(None, help="Sequence length (default 2048)."),
    micro_batch: Optional[int] = typer.Option(None, help="Micro-batch per GPU."),
    gradient_checkpointing: Optional[bool] = typer.Option(None, "--gradient-checkpointing/--no-gradient-checkpointing", help="Activation checkpointing."),
    attention: Optional[str] = typer.Option(None, help="attn_implementation (default: transformers' choice for the model)."),
    task: Optional[str] = typer.Option(None, "--task", help="Head to trace (default: the config's architectures)."),
    target_len: Optional[int] = typer.Option(None, "--target-len", help="Encoder-decoder models: decoder tokens per sequence."),
    top: int = typer.Option(12, min=0, help="Modules to list at each peak."),
    json_out: bool = typer.Option(False, "--json", help="Print the breakdown as JSON."),
) -> None:
    """Trace one training step (forward, loss, backward) of the real model code on fake tensors and
    show what is live at the forward and backward peaks, by category and by module. No GPU needed."""
    from memfit.core.scenario.read import ScenarioInputs, build_scenario, merge_inputs, read_scenario_file
    from memfit.render.trace_out import render_trace, trace_to_dict

    flags = ScenarioInputs(model=model, peft_method=peft, deepspeed=str(deepspeed) if deepspeed else None, gpus=gpus,
                           seq_len=seq_len, micro_batch=micro_batch, gradient_checkpointing=gradient_checkpointing,
                           attention=attention, task=task, target_len=target_len)
    inputs = merge_inputs(read_scenario_file(scenario), flags) if scenario else flags
    sc = build_scenario(inputs)
    _warn_inputs(sc)
    result = _trace_with_progress(sc)
    z3 = None
    if sc.deepspeed.zero.stage == 3:
        from memfit.trace.deepspeed.zero3_step import zero3_step_memory

        z3 = zero3_step_memory(result, sc.deepspeed, sc.world_size)
    if json_out:
        import json

        typer.echo(json.dumps(trace_to_dict(result, z3), indent=2))
        return
    render_trace(result, z3, _console(), top=top)


@app.command()
def replay(
    scenario: Path = typer.Argument(..., help="Scenario YAML file to replay (see examples/)."),
    layers: Optional[int] = typer.Option(None, min=1, help="Build this many transformer blocks instead of the config's (same shapes, scaled down)."),
    world_size: Optional[int] = typer.Option(None, min=1, help="Ranks W (rank 0 is measured, see --launcher); default: the scenario's GPU count."),
    launcher: str = typer.Option("fake", help="fake (one process plays rank 0 of W on a fake process group) or torchrun (W real processes on this host: gloo on cpu, nccl on cuda, one GPU each)."),
    accelerator: str = typer.Option("cpu", help="cpu (DeepSpeed's CPU accelerator; runs anywhere) or cuda."),
    emulate: Optional[str] = typer.Option(None, help="cuda: cap the GPU at this capacity, e.g. rtx3090 or 24GiB."),
    steps: int = typer.Option(2, min=1, help="Training steps to run."),
    seq_len: Optional[int] = typer.Option(None, help="Override the scenario's sequence length."),
    timeout: float = typer.Option(1800, help="Seconds before the replay is stopped (a finite number > 0)."),
    save_fixture: Optional[Path] = typer.Option(None, "--save-fixture", help="Write the measurement as a JSON fixture (never overwrites)."),
    json_out: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
) -> None:
    """Run the real deepspeed.initialize (or, for framework torch/ddp/fsdp/fsdp2, the plain torch
    loop) and training steps for a scenario in a supervised child process, measure memory per
    phase, and compare with the plan (byte for byte where the allocations are deterministic)."""
    from memfit.core.scenario.read import ScenarioInputs, build_scenario, merge_inputs, read_scenario_file
    from memfit.replay.compare import compare_replay
    from memfit.replay.measurement import save_fixture as write_fixture
    from memfit.replay.runner import run_replay
    from memfit.replay.spec import spec_from_scenario
    from memfit.render.replay_out import comparison_to_dict, render_comparison

    import math

    if not math.isfinite(timeout) or timeout <= 0:
        raise MemfitError(f"--timeout must be a finite number of seconds > 0, got {timeout}")
    inputs = merge_inputs(read_scenario_file(scenario), ScenarioInputs(seq_len=seq_len))
    sc = build_scenario(inputs)
    _warn_inputs(sc)
    if save_fixture is not None:
        import os

        if os.path.lexists(save_fixture):
            raise MemfitError(f"{save_fixture} exists; memfit never overwrites a file you have (choose another path)")
        if not save_fixture.parent.is_dir():
            raise MemfitError(f"--save-fixture: {save_fixture.parent} is not a directory")
    cap = None
    if emulate:
        cap = _emulated_capacity(emulate)
    spec = spec_from_scenario(sc, layers=layers, steps=steps, accelerator=accelerator, world_size=world_size,
                              emulate_capacity_bytes=cap, launcher=launcher)
    from rich.text import Text

    with _console(stderr=True).status(Text(f"replaying {spec.name} ({accelerator}, {launcher}, rank 0 of "
                                           f"{spec.world_size}" + (f", {layers} layers" if layers else "") + ")...")):
        m = run_replay(spec, timeout_s=timeout)
    if save_fixture is not None:
        write_fixture(m, str(save_fixture))
    result = compare_replay(m) if m.ok or m.phases else None
    if json_out:
        import json

        typer.echo(json.dumps(comparison_to_dict(result, m), indent=2))
    else:
        render_comparison(result, m, _console())
    if not m.ok:
        raise typer.Exit(1)


def _emulate_help() -> str:
    from memfit.core.hardware import GPU_PRESETS

    return f"a GPU ({', '.join(sorted(GPU_PRESETS))}) or a size such as 24GiB"


def _emulated_capacity(text: str) -> int:
    """``--emulate``: a GPU preset or a size, each parsed as itself (a wrong name is named as such)."""
    from memfit.core.hardware import GPU_ALIASES, GPU_PRESETS, parse_size

    kind = text.strip().lower()
    kind = GPU_ALIASES.get(kind, kind)
    if kind in GPU_PRESETS:
        return GPU_PRESETS[kind].total_bytes
    if kind[:1].isdigit() or kind[:1] == ".":
        return parse_size(text, what="--emulate")
    raise MemfitError(f"--emulate: unknown GPU {text!r}; give {_emulate_help()}")


@app.command()
def recommend(
    scenario: Path = typer.Argument(..., help="Scenario YAML file (see examples/): your model, DeepSpeed JSON, hardware."),
    top: int = typer.Option(5, "--top", help="Configurations to return."),
    out: Optional[Path] = typer.Option(None, "--out", help="Directory to write each configuration's DeepSpeed JSON, script diff and scenario file (never overwrites)."),
    headroom: float = typer.Option(0.1, "--headroom", help="Fraction of GPU memory and of host RAM to keep free in every phase."),
    report: Optional[Path] = typer.Option(None, "--report", help="Also write a report (.html or .md): the recommendations, then your configuration's plan with its charts. Never overwrites."),
    json_out: bool = typer.Option(False, "--json", help="Print the recommendations as JSON."),
) -> None:
    """Search the settings you can change (under DeepSpeed: ZeRO stage, offload, pinning, zero.Init,
    load dtype, buckets, bf16/fp16; otherwise: framework, FSDP sharding and offload, precision mode,
    optimizer, 4-bit base; always micro-batch vs accumulation and checkpointing) for configurations that
    fit every phase with headroom, ranked by an estimated step time; each is confirmed by the exact ledger."""
    import math
    import time

    from memfit.core.recommend import recommend as run_recommend
    from memfit.core.scenario.read import read_scenario_file

    if not (math.isfinite(headroom) and 0 <= headroom < 1):
        raise MemfitError(f"--headroom must be a fraction from 0 to below 1, got {headroom}")
    if top < 1:
        raise MemfitError(f"--top must be at least 1, got {top}")
    if report is not None:
        _check_report_path(report)
    inputs = read_scenario_file(scenario)
    from memfit.core.scenario.read import build_scenario as _build

    _warn_inputs(_build(inputs))  # what DeepSpeed would ignore in the user's config, said before the search
    if out is not None and out.exists() and not out.is_dir():
        raise MemfitError(f"--out {out} exists and is not a directory")
    started = time.perf_counter()
    bar: dict = {}

    def progress(done: int, total: int) -> None:  # shown only once the search has run a second, on a terminal
        if "p" not in bar and (time.perf_counter() - started < 1.0 or not sys.stderr.isatty()):
            return
        if "p" not in bar:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            bar["p"] = Progress(TextColumn("searching configurations"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=_console(stderr=True), transient=True)
            bar["p"].start()
            bar["t"] = bar["p"].add_task("search", total=total)
        bar["p"].update(bar["t"], completed=done, total=total)

    try:
        result = run_recommend(inputs, top=top, headroom=headroom, progress=progress)
    finally:
        if "p" in bar:
            bar["p"].stop()
    if out is not None:
        from memfit.core.recommend.files import write_recommendations

        result = write_recommendations(result, out)
    if report is not None:
        from memfit.core.scenario.read import build_scenario
        from memfit.render.recommend_out import render_recommendations as _render

        _write_report(report, result.baseline, build_scenario(inputs), title=f"memfit recommend: {result.scenario_name}",
                      render=lambda console: _render(result, console), heading="Configurations that fit")
    if json_out:
        import json

        from memfit.render.recommend_out import recommendations_to_dict

        typer.echo(json.dumps(recommendations_to_dict(result), indent=2))
        return
    from memfit.render.recommend_out import render_recommendations

    render_recommendations(result, _console())


@app.command()
def diagnose(
    scenario: Optional[Path] = typer.Argument(None, help="Scenario YAML (see examples/) to reconcile the log's figures with the plan."),
    log: str = typer.Option(..., "--log", "-l", help="The pasted traceback or log file (- reads standard input); noise, colours and interleaved ranks are fine."),
    report: Optional[Path] = typer.Option(None, "--report", help="Also write a report (.html or .md): the diagnosis, then the plan with its charts. Never overwrites."),
    json_out: bool = typer.Option(False, "--json", help="Print the diagnosis as JSON."),
) -> None:
    """Read a traceback or log: what failed (CUDA or host out of memory, a failed pinned allocation,
    NCCL, an op build), in which phase and why, with the usual fixes; with a scenario, how the log's
    figures compare with the plan's ledger. Exit status 1 if the log has no recognisable error."""
    from memfit.core.diagnose import diagnose_log, read_log

    text = read_log(log)
    sc = result = None
    if scenario is not None:
        from memfit.core.plan import make_plan
        from memfit.core.scenario.read import build_scenario, read_scenario_file

        sc = build_scenario(read_scenario_file(scenario))
        _warn_inputs(sc)
        result = make_plan(sc)
    if report is not None:
        _check_report_path(report)
    found = diagnose_log(text, result, sc)
    if found.primary is None:
        print(f"memfit: {found.headline} ({log}): looked for CUDA and host out-of-memory errors, failed pinned "
              f"allocations, NCCL errors and DeepSpeed op build failures", file=sys.stderr)
        sys.exit(1)  # typer.Exit would be swallowed by main()'s standalone_mode=False
    if report is not None:
        from memfit.render.diagnose_out import render_diagnosis as _render

        _write_report(report, result, sc, title=f"memfit diagnose: {found.headline}",
                      render=lambda console: _render(found, console), heading="Diagnosis")
    if json_out:
        import json

        from memfit.render.diagnose_out import diagnosis_to_dict

        typer.echo(json.dumps(diagnosis_to_dict(found), indent=2))
        return
    from memfit.render.diagnose_out import render_diagnosis

    render_diagnosis(found, _console())


@app.command()
def compare(
    scenario: Path = typer.Argument(..., help="Scenario YAML of the run that was recorded (see examples/)."),
    records: list[Path] = typer.Argument(..., help=(
        "What the real run left: a memfit.record directory (stats.rank<R>.json, snapshot.rank<R>.pickle), a "
        "torch.cuda.memory._dump_snapshot pickle (read without running anything in it), a JSON of "
        "torch.cuda.memory_stats()/host_memory_stats() per phase, a log with DeepSpeed see_memory_usage lines, "
        "or an nvidia-smi CSV (--query-gpu=timestamp,memory.used --format=csv). Several may be given.")),
    rank: Optional[int] = typer.Option(None, "--rank", help="Which rank's records to compare (default: the lowest recorded)."),
    report: Optional[Path] = typer.Option(None, "--report", help="Also write a report: .html (self-contained, the recording's chart under the plan's) or .md. Never overwrites."),
    json_out: bool = typer.Option(False, "--json", help="Print the reconciliation as JSON (schema memfit.compare, version 1)."),
) -> None:
    """Reconcile the plan with what a real run recorded: per phase, planned vs recorded allocated,
    reserved, pinned and nvidia-smi memory (GiB = 2^30 B; each recorded figure says its source), the
    snapshot's allocations attributed to ledger items by their stack frames, the allocations the plan
    does not have and the planned ones that never happened, and the allocator simulator's check of the
    recorded alloc/free sequence. Record a run with memfit.record or memfit.integrations.MemfitCallback.

    RECORDS are any of: a memfit.record directory (stats.rank<R>.json, snapshot.rank<R>.pickle); a
    torch.cuda.memory._dump_snapshot pickle (read without running anything in it); a JSON of
    torch.cuda.memory_stats()/host_memory_stats() per phase; a log with DeepSpeed see_memory_usage
    lines ("memory_breakdown": true); an nvidia-smi CSV (--query-gpu=timestamp,memory.used --format=csv).
    """
    from memfit.core.compare import reconcile
    from memfit.core.plan import make_plan
    from memfit.core.records import read_records
    from memfit.core.scenario.read import build_scenario, read_scenario_file

    sc = build_scenario(read_scenario_file(scenario))
    _warn_inputs(sc)
    if report is not None:
        _check_report_path(report)
    plan_result = make_plan(sc)
    rc = reconcile(plan_result, read_records([str(r) for r in records]), rank=rank,
                   capacity_bytes=sc.hardware.gpu.total_bytes)
    if report is not None:
        _write_compare_report(report, rc, plan_result, sc)
    if json_out:
        import json

        from memfit.render.compare_out import reconciliation_to_dict

        typer.echo(json.dumps(reconciliation_to_dict(rc), indent=2))
        return
    from memfit.render.compare_out import render_reconciliation

    render_reconciliation(rc, _console())


def _write_compare_report(path: Path, rc, plan_result, sc) -> None:
    from memfit.render.charts import timeline_chart_svg
    from memfit.render.compare_out import html_sections, markdown_sections
    from memfit.render.report import html_report, markdown_report

    suffix = _check_report_path(path)
    title = f"memfit compare: {rc.scenario_name}"
    svg = timeline_chart_svg(rc.timeline, f"Recorded, rank {rc.rank}: memory over the run (GPU, per rank)") if rc.timeline else None
    if suffix == ".md":
        out = markdown_report(plan_result, sc, title=title, markdown=markdown_sections(rc, svg))
    else:
        out = html_report(plan_result, sc, sections=html_sections(rc), title=title,
                          figures=(("recording-chart", svg),) if svg else ())
    path.write_text(out, encoding="utf-8")
    _console(stderr=True).print(f"report written to {path}")


@app.command()
def models() -> None:
    """List the shipped model configs (exact parameter counts, no download needed)."""
    from rich.table import Table

    from memfit.core.catalog import list_catalog

    t = Table(title="Shipped model configs")
    t.add_column("name")
    t.add_column("type")
    t.add_column("architecture")
    t.add_column("aliases")
    for e in list_catalog():
        t.add_row(e.name, e.model_type, e.architecture, ", ".join(e.aliases))
    _console().print(t)


@app.command("zero-paper")
def zero_paper(json_out: bool = typer.Option(False, "--json", help="Print as JSON.")) -> None:
    """Reproduce the ZeRO paper's model-states figures (7.5B params, Adam, 64 GPUs) from memfit's ledger."""
    from memfit.core.zero_paper import PAPER_GPUS, PAPER_PARAMS, zero_paper_table

    rows = zero_paper_table()
    if json_out:
        import json

        typer.echo(json.dumps([{"stage": r.stage, "bytes_per_gpu": r.bytes_per_gpu, "paper_gb": r.paper_gb} for r in rows], indent=2))
        return
    from rich.table import Table

    t = Table(title=f"Model states per GPU: {PAPER_PARAMS:,} params, mixed-precision Adam, {PAPER_GPUS} GPUs (GB = 10^9 B)")
    t.add_column("ZeRO stage")
    t.add_column("memfit ledger (bytes)", justify="right")
    t.add_column("memfit (GB)", justify="right")
    t.add_column("paper (GB)", justify="right")
    for r in rows:
        t.add_row(str(r.stage), f"{r.bytes_per_gpu:,}", f"{r.bytes_per_gpu / 1e9:.2f}", f"{r.paper_gb:g}")
    _console().print(t)


def _forbid_blank_values(command) -> None:
    """Every option and argument of every command refuses an empty or blank value (``--gpus ''``):
    one generic check installed here, so an option added later gets it with no code of its own.
    (An empty value would otherwise become "not given" and take the default: a silent guess.)"""
    import click

    for cmd in [command, *getattr(command, "commands", {}).values()]:
        for param in cmd.params:
            def process_value(ctx, value, _orig=param.process_value, _param=param):
                values = value if isinstance(value, (tuple, list)) else (value,)
                if any(isinstance(v, str) and not v.strip() for v in values):
                    raise click.BadParameter("is empty: give a value, or leave the option out for its default",
                                             ctx=ctx, param=_param)
                return _orig(ctx, value)

            param.process_value = process_value


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def main() -> None:
    """Entry point: bad input becomes one line on stderr and exit status 2, never a traceback."""
    import typer.main

    command = typer.main.get_command(app)
    _forbid_blank_values(command)
    try:
        rc = command(standalone_mode=False, prog_name="memfit")
    except MemfitError as e:
        print(f"memfit: error: {_one_line(e)}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("memfit: interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # `memfit` alone: the help was printed
            sys.exit(0)
        # usage errors (typer vendors click: match by behaviour, not by class)
        if hasattr(e, "exit_code") and hasattr(e, "format_message"):
            print(f"memfit: error: {_one_line(e.format_message())} (see memfit --help)", file=sys.stderr)
            sys.exit(e.exit_code or 2)
        if type(e).__name__ == "Abort":
            sys.exit(1)
        raise
    if isinstance(rc, int) and rc:
        sys.exit(rc)


if __name__ == "__main__":
    main()
