"""What every command shares: the consoles, the inputs warnings, writing new files and reports, and the
trace's progress display. Heavy imports stay inside the functions."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Optional

import typer

from memfit.errors import MemfitError


def console(stderr: bool = False):
    """Console for every command's output. ``markup=False``: a scenario name, model or path that
    looks like rich markup (``[/bold]``) is printed as written, never interpreted; ``emoji=False``
    likewise for ``:name:`` (and rich's emoji table, 3.4 ms to import, stays out of start-up)."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, markup=False, emoji=False)


def warn_inputs(sc) -> None:
    """Print what DeepSpeed or another library would ignore in the inputs (and what memfit reads but
    does not model), one line each, on stderr (the plan's findings carry them too)."""
    for w in (*sc.deepspeed.warnings, *sc.input_warnings):
        print(f"memfit: warning: {w}", file=sys.stderr)


def show_assumptions(sc, out=None) -> None:
    """The block of values no input gave (``Scenario.assumptions``), in the command's own output:
    every command but ``plan`` (whose page has it) prints it after its result."""
    from memfit.render.assumptions import render_assumptions

    render_assumptions(sc, out or console())


# ------------------------------------------------------------------------------ scenario inputs

def _scenario_flags(
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
    deepspeed_version: Optional[str] = typer.Option(None, help="The run's DeepSpeed release, e.g. 0.5.8 or 0.19 (default 0.19.8, said as assumed); its allocation model: 0.5 (Jan 2022), 0.6, or 0.19 (0.13-0.19)."),
    gpus: Optional[str] = typer.Option(None, "--gpus", "-g", help="GPUs per node, e.g. 2xrtx3090, 8xa100-80gb, 2x24GiB (default 1xa100-80gb, said as an assumption)."),
    nodes: Optional[int] = typer.Option(None, help="Number of nodes."),
    cpu_ram: Optional[str] = typer.Option(None, help="Host RAM per node with its unit, e.g. 64GB or 256GiB (default 256GB, said as an assumption; a number alone is refused)."),
    nvme: Optional[str] = typer.Option(None, help="Free NVMe space per node for offload, with its unit, e.g. 2TB."),
    load_dtype: Optional[str] = typer.Option(None, help="from_pretrained torch_dtype: fp32, fp16 or bf16 (left out: the stack's default, 5.x config.json's dtype, 4.x fp32)."),
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
    accelerator: Optional[str] = typer.Option(None, help="cuda (default) or cpu (a CPU run: DeepSpeed's CPU accelerator, as CPU replays run; TrainingArguments' use_cpu)."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="Allow configs whose model needs remote code (never on by default)."),
    attention: Optional[str] = typer.Option(None, help="attn_implementation: eager, sdpa, flash_attention_2, flash_attention_3 or flex_attention (default: transformers' choice for the model, sdpa where supported)."),
    task: Optional[str] = typer.Option(None, "--task", help="Head to plan: causal-lm, masked-lm, seq2seq-lm, sequence-classification, token-classification, question-answering (default: the config's architectures)."),
    target_len: Optional[int] = typer.Option(None, "--target-len", help="Encoder-decoder models: decoder tokens per sequence (--seq-len is the encoder's; default: the same)."),
    lengths: Optional[Path] = typer.Option(None, "--lengths", help="File of token counts per sample (one per line), or a histogram (length,count lines or JSON): plan the largest batch the batching forms."),
    batching: Optional[str] = typer.Option(None, "--batching", help="With --lengths: pad-longest (default: each batch padded to its longest sample), bucket (group_by_length) or pack (rows of --max-seq-length)."),
    max_seq_length: Optional[int] = typer.Option(None, "--max-seq-length", help="Truncation length: with --lengths, each sample is cut to it (and the row length of --batching pack); without, every sequence is taken at it (instead of --seq-len)."),
    torch_version: Optional[str] = typer.Option(None, "--torch-version", help="torch release whose allocator rules apply, e.g. 2.13 (default) or 1.10 (pinned blocks not rounded to powers of two)."),
    transformers_version: Optional[str] = typer.Option(None, "--transformers-version", help="The run's transformers release, e.g. 4.15.0 (default 5.24): from_pretrained's loading path and low_cpu_mem_usage default and the Trainer's defaults follow it; before 4.6 the Trainer writes the DeepSpeed config's micro batch and accumulation itself."),
    alloc_conf: Optional[str] = typer.Option(None, "--alloc-conf", help="PYTORCH_CUDA_ALLOC_CONF of the run, e.g. expandable_segments:True (checked against that torch version)."),
    alloc_conf_from_env: bool = typer.Option(False, "--alloc-conf-from-env", help="Read PYTORCH_CUDA_ALLOC_CONF (then PYTORCH_ALLOC_CONF) from this environment; never done unless asked."),
    cuda_version: Optional[str] = typer.Option(None, "--cuda-version", help="CUDA of the torch build, e.g. 12.8 (default: the usual one for that torch); lazy kernel loading needs >= 11.7."),
    pin_memory_backend: Optional[str] = typer.Option(None, "--pin-memory-backend", help="DeepSpeed 0.19's DS_PIN_MEMORY_BACKEND: torch (default) or native (mlock, no torch cache)."),
    peft_version: Optional[str] = typer.Option(None, "--peft-version", help="The run's peft release (none: not installed; default 0.21)."),
    bitsandbytes_version: Optional[str] = typer.Option(None, "--bitsandbytes-version", help="The run's bitsandbytes release, e.g. 0.43.1 (4-bit layers keep their input up to 0.43.1; none: not installed); default 0.50.2."),
    accelerate_version: Optional[str] = typer.Option(None, "--accelerate-version", help="The run's accelerate release (default 1.15)."),
    trl_version: Optional[str] = typer.Option(None, "--trl-version", help="The run's TRL release (default 0.24)."),
    stack: Optional[list[Path]] = typer.Option(None, "--stack", help="A file that states the run's versions: pip freeze or requirements.txt, `transformers env` or `accelerate env` output, or `ds_report` output (repeatable; below every other input: a version flag, the scenario or another file overrides it)."),
    save: Optional[bool] = typer.Option(None, "--save/--no-save", help="Whether the run saves the model at the end (default: it does; --no-save drops the plan's save phase)."),
    dataloader_workers: Optional[int] = typer.Option(None, "--dataloader-workers", help="DataLoader num_workers per rank (forked processes: their host memory; default 0)."),
    dataloader_pin_memory: Optional[bool] = typer.Option(None, "--dataloader-pin-memory/--no-dataloader-pin-memory", help="DataLoader(pin_memory=True): batches in page-locked memory (the Trainer's default; off for a plain loop)."),
    dataset_tokens: Optional[int] = typer.Option(None, "--dataset-tokens", help="Tokens of the tokenized dataset held in host memory (default: not counted)."),
    framework: Optional[str] = typer.Option(None, "--framework", help="deepspeed | torch (one GPU: a plain loop or the HF Trainer) | ddp | fsdp | fsdp2 (default: inferred; a DeepSpeed JSON means deepspeed)."),
    optim: Optional[str] = typer.Option(None, "--optim", help="The Trainer's optim string (adamw_torch, adamw_torch_fused, adafactor, sgd, adamw_bnb_8bit, paged_adamw_8bit, paged_adamw_32bit, lion_32bit, lion_8bit, ...); under DeepSpeed, the client optimizer when the config has no optimizer section."),
    training_args: Optional[Path] = typer.Option(None, "--training-args", help="A Hugging Face TrainingArguments or TRL SFTConfig as JSON/YAML: batch size, accumulation, checkpointing, bf16/fp16, optim, max_length, fsdp, deepspeed, use_cpu."),
    bnb_config: Optional[Path] = typer.Option(None, "--bnb-config", help="A BitsAndBytesConfig as JSON (or a config.json with a quantization_config)."),
    accelerate_config: Optional[Path] = typer.Option(None, "--accelerate-config", help="An accelerate config YAML (distributed_type, mixed_precision, num_processes, fsdp_config, deepspeed_config)."),
    quantization: Optional[str] = typer.Option(None, "--quantization", help="bitsandbytes quantization of the base model: none | 4bit | 8bit (4bit: nf4 + double quant + bf16 compute, QLoRA's usual; give a BitsAndBytesConfig for other settings)."),
    shared_gpu: bool = typer.Option(False, "--shared-gpu", help="Other processes (a display, other jobs) may use the GPUs: a GPU that fits is at risk at best."),
    host_reserve: Optional[str] = typer.Option(None, "--host-reserve", help="Host RAM per node kept for the OS and other processes, e.g. 8GiB (default: 330 MiB + 5% of RAM + 100 MiB, a node agent's documented reserve)."),
    swap: Optional[str] = typer.Option(None, "--swap", help="Swap space per node, e.g. 10GB (default: none). A phase whose host figure exceeds the RAM but not RAM + swap is at risk (it pages out, slowly), unless its page-locked (pinned) memory alone exceeds the RAM."),
    eval_strategy: Optional[str] = typer.Option(None, "--eval-strategy", help="The Trainer's eval_strategy: no (default), steps or epoch; with steps or epoch the plan has eval.forward (and eval.generate) phases."),
    eval_batch: Optional[int] = typer.Option(None, "--eval-batch", help="per_device_eval_batch_size (default 8)."),
    eval_seq_len: Optional[int] = typer.Option(None, "--eval-seq-len", help="Tokens of an eval input, the prompt of generate (default: --seq-len)."),
    eval_generate: Optional[bool] = typer.Option(None, "--eval-generate/--no-eval-generate", help="predict_with_generate: evaluation calls model.generate (KV cache, beams)."),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help="Tokens generate adds (or give --generation-max-length)."),
    generation_max_length: Optional[int] = typer.Option(None, "--generation-max-length", help="generation_max_length: the output's length (encoder-decoders) or prompt + new tokens (decoder-only)."),
    num_beams: Optional[int] = typer.Option(None, "--num-beams", help="generation_num_beams (default 1: greedy)."),
    eval_steps: Optional[int] = typer.Option(None, "--eval-steps", help="eval_steps: optimizer steps between evaluations (in the epoch simulation)."),
    epoch: Optional[bool] = typer.Option(None, "--epoch/--no-epoch", help="Simulate an epoch of steps of varying batch shapes through one caching allocator (on with --lengths; without it memfit's default length distribution, stated)."),
    epoch_steps: Optional[int] = typer.Option(None, "--epoch-steps", help="Optimizer steps the epoch simulation runs (default: one epoch, at most 1,000)."),
    empty_cache_steps: Optional[int] = typer.Option(None, "--empty-cache-steps", help="The Trainer's torch_empty_cache_steps: torch.cuda.empty_cache() every N steps, after the forward."),
) -> None:
    """The inputs every command takes (``scenario_command``): their options and help, in one place."""


_FIELD = {"peft": "peft_method", "deepspeed_version": "ds_version", "stack": "stack_files"}
_PEFT_OPTIONS = {"num_virtual_tokens": "num_virtual_tokens", "prefix_projection": "prefix_projection",
                 "encoder_hidden_size": "encoder_hidden_size", "lora_r": "lora_r", "target_modules": "target_modules",
                 "lora_bias": "lora_bias", "freeze": "freeze_patterns"}
_PRECEDENCE_HELP = ("Inputs: a scenario YAML and/or the flags; flags > scenario > TrainingArguments/SFTConfig > "
                    "accelerate config > BitsAndBytesConfig > DeepSpeed \"auto\" > stack files (--stack) > defaults "
                    "(docs/inputs.md).")


def _flag_name(param) -> str:
    decls = [d for d in getattr(param.default, "param_decls", ()) or () if d.startswith("--")]
    return decls[0].split("/")[0] if decls else "--" + param.name.replace("_", "-")


@functools.cache
def _scenario_params() -> tuple:
    """``_scenario_flags``' parameters, their annotations evaluated: once per process (each command's
    decoration and each run read them; evaluating the 60 annotations is 60 compilations)."""
    import inspect

    return tuple(inspect.signature(_scenario_flags, eval_str=True).parameters.values())


def inputs_from_flags(**given) -> "ScenarioInputs":  # noqa: F821
    """``ScenarioInputs`` of the flags given (None: not given), each field's origin its flag."""
    from memfit.core.scenario.inputs import ScenarioInputs

    flags = {p.name: _flag_name(p) for p in _scenario_params()}
    fields: dict = {}
    origins: dict[str, str] = {}
    options: dict = {}
    for name, value in given.items():
        if value is None or value is False and name in ("trust_remote_code", "alloc_conf_from_env", "shared_gpu") \
                or isinstance(value, (list, tuple)) and not value:
            continue
        if name in _PEFT_OPTIONS:
            options[_PEFT_OPTIONS[name]] = value
            origins["peft_options"] = flags[name]
            continue
        field = _FIELD.get(name, name)
        if name == "quantization":
            value = quant_flag(value)
        elif isinstance(value, Path):
            value = str(value)
        elif isinstance(value, (list, tuple)):  # --stack FILE, repeatable
            value = tuple(str(v) for v in value)
        fields[field] = value
        origins[field] = flags[name]
    return ScenarioInputs(peft_options=options, origins=origins, **fields)


def scenario_inputs(scenario: Optional[Path], flags) -> "ScenarioInputs":  # noqa: F821
    """The scenario file (if any) with the flags over it (``merge_inputs``: each override said)."""
    from memfit.core.scenario.inputs import merge_inputs
    from memfit.core.scenario.read import read_scenario_file

    return merge_inputs(read_scenario_file(scenario), flags) if scenario is not None else flags


def scenario_command(fn=None, *, exclude: tuple[str, ...] = (), records_follow: bool = False):
    """Give a command every scenario flag (``_scenario_flags``), the same for every command: its
    handler takes ``inputs`` (the scenario file named by its ``scenario`` argument, if any, with the
    flags over it) instead of them. Flags the command defines itself, or ``exclude``, are left out.
    ``records_follow``: file arguments follow the scenario (``compare SCENARIO RECORDS...``); with
    ``--model`` given, a first argument that is not a .yaml/.yml file is a record, not the scenario
    (the handler then gets ``scenario=None`` and the argument at the head of ``records``); with no
    records and no flags, ``inputs`` is None (``compare CASE.yaml``: a published-run case)."""
    import functools
    import inspect

    def wrap(fn):
        sig = inspect.signature(fn, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != "inputs"]
        names = {p.name for p in own} | set(exclude)
        shared = [p for p in _scenario_params() if p.name not in names]
        shared_names = [p.name for p in shared]

        @functools.wraps(fn)
        def command(**kwargs):
            given = {name: kwargs.pop(name) for name in shared_names}
            flags = inputs_from_flags(**given)
            path = kwargs.get("scenario")
            if records_follow and path is not None and flags.model is not None and \
                    Path(path).suffix.lower() not in (".yaml", ".yml"):
                kwargs["records"] = [path, *(kwargs.get("records") or [])]
                kwargs["scenario"] = path = None
            if records_follow and not kwargs.get("records") and not flags.origins:
                kwargs["inputs"] = None  # no records, no flags: the command reads its argument itself
                return fn(**kwargs)
            kwargs["inputs"] = scenario_inputs(path, flags)
            return fn(**kwargs)

        command.__signature__ = sig.replace(parameters=own + [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
                                                              for p in shared])
        command.__annotations__ = {**{p.name: p.annotation for p in own}, **{p.name: p.annotation for p in shared}}
        if command.__doc__ and _PRECEDENCE_HELP not in command.__doc__:
            command.__doc__ = command.__doc__.rstrip() + "\n\n" + _PRECEDENCE_HELP
        return command

    return wrap(fn) if fn is not None else wrap


def quant_flag(value: Optional[str]) -> Optional[dict]:
    """``--quantization``: ``4bit`` is QLoRA's usual BitsAndBytesConfig (nf4, double quant, bf16 compute)."""
    if value is None:
        return None
    if value == "4bit":
        return {"method": "4bit", "quant_type": "nf4", "double_quant": True, "compute_dtype": "bf16"}
    if value in ("8bit", "none"):
        return {"method": value}
    raise MemfitError(f"--quantization must be none, 4bit or 8bit, got {value!r}")


def check_report_path(path: Path) -> str:
    """``--report``'s path, before the work: a .html/.md name, nothing there yet (a dangling link
    included), its folder a directory (``memfit.core.writing.check_new_path``)."""
    from memfit.core.writing import check_new_path

    suffix = path.suffix.lower()
    if suffix not in (".html", ".htm", ".md"):
        raise MemfitError(f"--report: give a .html or .md path, got {path}")
    check_new_path(path, what="--report")
    return suffix


def write_new_file(path: Path, text: str, *, what: str) -> None:
    """Create ``path`` and write ``text``, never replacing anything and never through a link: memfit's
    one writer (``memfit.core.writing.write_file``: ``O_CREAT | O_EXCL | O_NOFOLLOW``)."""
    from memfit.core.writing import write_file

    write_file(path, text, what=what)


def write_report(path: Path, result, sc, *, title: str | None = None, render=None, heading: str = "",
                 figures: tuple[tuple[str, str], ...] = ()) -> None:
    """Write the plan's report; ``render(console)`` (a terminal renderer) adds a section first;
    ``figures`` (id, SVG) are charted under the plan's (HTML)."""
    from memfit.render.report import html_report, markdown_report, rich_fragment, section_page

    suffix = check_report_path(path)
    html_sections, text_sections = (), ()
    if render is not None:
        html, text = rich_fragment(render)
        html_sections, text_sections = ((heading, html),), ((heading, text),)
    if suffix == ".md":
        out = markdown_report(result, sc, sections=text_sections, title=title)
    elif result is None:
        out = section_page(title or "memfit", html_sections)
    else:
        out = html_report(result, sc, sections=html_sections, title=title, figures=figures)
    write_new_file(path, out, what="--report")
    console(stderr=True).print(f"report written to {path}")


def trace_with_progress(sc):
    """Run the trace with a progress display on stderr (the trace takes seconds to a minute)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from memfit.trace.ledger_step import trace_scenario

    with Progress(TextColumn("{task.description}", style="progress.description", markup=False), BarColumn(), TimeElapsedColumn(),
                  console=console(stderr=True), transient=True) as bar:
        tasks: dict[str, int] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(f"tracing: {stage}", total=max(total, 1))
            bar.update(tasks[stage], completed=done, total=max(total, 1))

        return trace_scenario(sc, progress=progress)
