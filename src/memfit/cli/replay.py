"""``memfit replay``: the real library run in a supervised child process, measured against the plan."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from memfit.cli.application import app
from memfit.cli.common import console, scenario_command, show_assumptions, warn_inputs
from memfit.errors import MemfitError


@app.command()
@scenario_command
def replay(
    scenario: Optional[Path] = typer.Argument(None, help="Scenario YAML file to replay (see examples/); or give the scenario as flags."),
    layers: Optional[int] = typer.Option(None, min=1, help="Build this many transformer blocks instead of the config's (same shapes, scaled down)."),
    world_size: Optional[int] = typer.Option(None, min=1, help="Ranks W (rank 0 is measured, see --launcher); default: the scenario's GPU count."),
    launcher: str = typer.Option("fake", help="fake (one process plays rank 0 of W on a fake process group) or torchrun (W real processes on this host: gloo on cpu, nccl on cuda, one GPU each)."),
    accelerator: str = typer.Option("cpu", help="cpu (DeepSpeed's CPU accelerator; runs anywhere) or cuda."),
    emulate: Optional[str] = typer.Option(None, help="cuda: cap the GPU at this capacity, e.g. rtx3090 or 24GiB."),
    steps: int = typer.Option(2, min=1, help="Training steps to run."),
    timeout: float = typer.Option(1800, help="Seconds before the replay is stopped (a finite number > 0)."),
    save_fixture: Optional[Path] = typer.Option(None, "--save-fixture", help="Write the measurement as a JSON fixture (never overwrites)."),
    json_out: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    *,
    inputs,
) -> None:
    """Run the real deepspeed.initialize (or, for framework torch/ddp/fsdp/fsdp2, the plain torch
    loop) and training steps for a scenario in a supervised child process, measure memory per
    phase, and compare with the plan (byte for byte where the allocations are deterministic)."""
    from memfit.core.scenario.build import build_scenario
    from memfit.replay.compare import compare_replay
    from memfit.replay.measurement import save_fixture as write_fixture
    from memfit.replay.runner import run_replay
    from memfit.replay.spec import spec_from_scenario
    from memfit.render.replay_out import comparison_to_dict, render_comparison

    import math

    if not math.isfinite(timeout) or timeout <= 0:
        raise MemfitError(f"--timeout must be a finite number of seconds > 0, got {timeout}")
    sc = build_scenario(inputs)
    warn_inputs(sc)
    if save_fixture is not None:
        from memfit.core.writing import check_new_path

        check_new_path(save_fixture, what="--save-fixture",
                       exists_hint="memfit never overwrites a file you have (choose another path)")
    cap = None
    if emulate:
        cap = _emulated_capacity(emulate)
    spec = spec_from_scenario(sc, layers=layers, steps=steps, accelerator=accelerator, world_size=world_size,
                              emulate_capacity_bytes=cap, launcher=launcher)
    from memfit.render.replay_progress import ReplayProgress

    title = (f"replaying {spec.name} ({accelerator}, {launcher}, rank 0 of {spec.world_size}"
             + (f", {layers} layers" if layers else "") + ")")
    with ReplayProgress(console(stderr=True), title) as progress:
        m = run_replay(spec, timeout_s=timeout, on_progress=progress)
    if save_fixture is not None:
        write_fixture(m, str(save_fixture))
    result = compare_replay(m) if m.ok or m.phases else None
    if json_out:
        import json

        typer.echo(json.dumps(comparison_to_dict(result, m), indent=2))
    else:
        render_comparison(result, m, console(), plan_versions=_plan_versions(sc))
        show_assumptions(sc)
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


def _plan_versions(sc) -> str:
    """The library releases whose rules the plan applied (what the replay is compared with)."""
    rt = sc.runtime if hasattr(sc, "runtime") else None
    torch = getattr(rt, "torch_version", None) or "2.13"
    return (f"the plan's DeepSpeed {sc.ds_version}.x rules, torch {torch}" if sc.framework == "deepspeed"
            else f"the plan's {sc.framework} rules, torch {torch}")
