"""``memfit plan``: the phase-by-phase ledger, verdict and findings of one scenario."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from memfit.cli.app import app
from memfit.cli.common import check_report_path, console, quant_flag, trace_with_progress, warn_inputs, write_report


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
    deepspeed_version: Optional[str] = typer.Option(None, help="The run's DeepSpeed release, e.g. 0.5.8 or 0.19 (default 0.19.8, said as assumed); its allocation model: 0.5 (Jan 2022), 0.6, or 0.19 (0.13-0.19)."),
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
    transformers_version: Optional[str] = typer.Option(None, "--transformers-version", help="The run's transformers release, e.g. 4.15.0 (from_pretrained's loading path and low_cpu_mem_usage default, the Trainer's defaults follow it; default 5.24)."),
    peft_version: Optional[str] = typer.Option(None, "--peft-version", help="The run's peft release (none: not installed; default 0.21)."),
    bitsandbytes_version: Optional[str] = typer.Option(None, "--bitsandbytes-version", help="The run's bitsandbytes release (default 0.50)."),
    accelerate_version: Optional[str] = typer.Option(None, "--accelerate-version", help="The run's accelerate release (default 1.15)."),
    trl_version: Optional[str] = typer.Option(None, "--trl-version", help="The run's TRL release (default 0.24)."),
    stack: Optional[list[Path]] = typer.Option(None, "--stack", help="A file that states the run's versions: pip freeze or requirements.txt, `transformers env` or `accelerate env` output, or `ds_report` output (repeatable)."),
    dataloader_workers: Optional[int] = typer.Option(None, "--dataloader-workers", help="DataLoader num_workers per rank (forked processes: their host memory; default 0)."),
    dataloader_pin_memory: Optional[bool] = typer.Option(None, "--dataloader-pin-memory/--no-dataloader-pin-memory", help="DataLoader(pin_memory=True): batches in page-locked memory (the Trainer's default; off for a plain loop)."),
    dataset_tokens: Optional[int] = typer.Option(None, "--dataset-tokens", help="Tokens of the tokenized dataset held in host memory (default: not counted)."),
    framework: Optional[str] = typer.Option(None, "--framework", help="deepspeed | torch (one GPU: a plain loop or the HF Trainer) | ddp | fsdp | fsdp2 (default: inferred; a DeepSpeed JSON means deepspeed)."),
    optim: Optional[str] = typer.Option(None, "--optim", help="Outside DeepSpeed: the Trainer's optim string (adamw_torch, adamw_torch_fused, adafactor, sgd, adamw_bnb_8bit, paged_adamw_8bit, paged_adamw_32bit, lion_32bit, lion_8bit, ...)."),
    training_args: Optional[Path] = typer.Option(None, "--training-args", help="A Hugging Face TrainingArguments or TRL SFTConfig as JSON/YAML: batch size, accumulation, checkpointing, bf16/fp16, optim, max_length, fsdp, deepspeed."),
    bnb_config: Optional[Path] = typer.Option(None, "--bnb-config", help="A BitsAndBytesConfig as JSON (or a config.json with a quantization_config)."),
    accelerate_config: Optional[Path] = typer.Option(None, "--accelerate-config", help="An accelerate config YAML (distributed_type, mixed_precision, num_processes, fsdp_config, deepspeed_config)."),
    quantization: Optional[str] = typer.Option(None, "--quantization", help="bitsandbytes quantization of the base model: none | 4bit | 8bit (4bit: nf4 + double quant + bf16 compute, QLoRA's usual; give a BitsAndBytesConfig for other settings)."),
    shared_gpu: bool = typer.Option(False, "--shared-gpu", help="Other processes (a display, other jobs) may use the GPUs: a GPU that fits is at risk at best."),
    host_reserve: Optional[str] = typer.Option(None, "--host-reserve", help="Host RAM per node kept for the OS and other processes, e.g. 8GiB (default: 330 MiB + 5% of RAM + 100 MiB, a node agent's documented reserve)."),
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
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.inputs import ScenarioInputs, merge_inputs
    from memfit.core.scenario.read import read_scenario_file

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
        dataloader_workers=dataloader_workers, dataset_tokens=dataset_tokens, dataloader_pin_memory=dataloader_pin_memory,
        transformers_version=transformers_version, peft_version=peft_version,
        bitsandbytes_version=bitsandbytes_version, accelerate_version=accelerate_version, trl_version=trl_version,
        stack_files=tuple(str(p) for p in stack or ()),
        task=task, target_len=target_len, lengths=str(lengths) if lengths else None,
        batching=batching, max_seq_length=max_seq_length,
        framework=framework, precision=precision, optim=optim, grad_accum=grad_accum,
        quantization=quant_flag(quantization),
        training_args=str(training_args) if training_args else None, bnb_config=str(bnb_config) if bnb_config else None,
        accelerate_config=str(accelerate_config) if accelerate_config else None,
        shared_gpu=shared_gpu or None, host_reserve=host_reserve, eval_strategy=eval_strategy, eval_batch=eval_batch,
        eval_seq_len=eval_seq_len, eval_generate=eval_generate, max_new_tokens=max_new_tokens,
        generation_max_length=generation_max_length, num_beams=num_beams, eval_steps=eval_steps, epoch=epoch,
        epoch_steps=epoch_steps, empty_cache_steps=empty_cache_steps,
    )
    inputs = merge_inputs(read_scenario_file(scenario), flags) if scenario else flags
    sc = build_scenario(inputs)
    warn_inputs(sc)
    if report is not None:
        check_report_path(report)  # before any work: a bad path fails fast
    traced = None
    if sc.model.source == "meta" and not exact:  # no pure builder: its activations come from a trace
        for note in sc.model.notes:
            console(stderr=True).print(f"memfit: {note}")
        exact = True
    if exact:
        from memfit.trace.ledger_step import ledger_step

        traced = ledger_step(sc, trace_with_progress(sc))
    result = make_plan(sc, traced)
    if report is not None:
        write_report(report, result, sc)
    if json_out:
        import json

        from memfit.render.json_out import plan_to_dict
        from memfit.core.scenario.build import describe_scenario

        typer.echo(json.dumps(plan_to_dict(result, scenario=describe_scenario(sc)), indent=2))
        return
    from memfit.render.terminal import render_plan

    render_plan(result, sc, console(), all_items=all_items)
