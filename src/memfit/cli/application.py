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


VERBOSE = {"on": False}
"""``memfit --verbose``: show the libraries' captured messages (``cli.noise``) after the command."""


def _version(value: bool) -> None:
    if not value:
        return
    from importlib import metadata

    from memfit import __version__

    libs = []
    for dist in ("torch", "transformers", "peft", "deepspeed", "accelerate", "bitsandbytes", "trl"):
        try:
            libs.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            libs.append(f"{dist} not installed")
    print(f"memfit {__version__} (python {'.'.join(map(str, __import__('sys').version_info[:3]))}; installed: "
          f"{', '.join(libs)}; plans DeepSpeed 0.19 by default, 0.6 and 0.5 on request)")
    raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print memfit's version and the installed libraries' versions, then exit."),
    verbose: bool = typer.Option(False, "--verbose", help="Also show the messages libraries log while memfit runs "
                                 "(captured otherwise: bitsandbytes' optional-kernel warnings), each once."),
) -> None:
    VERBOSE["on"] = verbose
