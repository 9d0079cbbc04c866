"""``memfit trace``: what is live at the forward and backward peaks of a traced step."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from memfit.cli.app import app
from memfit.cli.common import console, trace_with_progress, warn_inputs


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
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.inputs import ScenarioInputs, merge_inputs
    from memfit.core.scenario.read import read_scenario_file
    from memfit.render.trace_out import render_trace, trace_to_dict

    flags = ScenarioInputs(model=model, peft_method=peft, deepspeed=str(deepspeed) if deepspeed else None, gpus=gpus,
                           seq_len=seq_len, micro_batch=micro_batch, gradient_checkpointing=gradient_checkpointing,
                           attention=attention, task=task, target_len=target_len)
    inputs = merge_inputs(read_scenario_file(scenario), flags) if scenario else flags
    sc = build_scenario(inputs)
    warn_inputs(sc)
    result = trace_with_progress(sc)
    z3 = None
    if sc.deepspeed.zero.stage == 3:
        from memfit.trace.deepspeed.zero3_step import zero3_step_memory

        z3 = zero3_step_memory(result, sc.deepspeed, sc.world_size)
    if json_out:
        import json

        typer.echo(json.dumps(trace_to_dict(result, z3), indent=2))
        return
    render_trace(result, z3, console(), top=top)
