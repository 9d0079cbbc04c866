"""The ``memfit`` Typer application that every command module registers itself with."""

from __future__ import annotations

import typer

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
