"""The ``memfit`` command line: one module per command (its options and help beside its handler),
``common`` for what they share, ``app`` for the Typer application they register with. Heavy imports
stay inside the handlers, so ``memfit --help`` and ``memfit plan`` start fast."""

from __future__ import annotations

import sys

# registers the commands, in the order --help lists them
from memfit.cli import plan, trace, replay, recommend, diagnose, compare, catalog  # noqa: F401, I001
from memfit.cli.app import app
from memfit.errors import MemfitError

__all__ = ["app", "main"]


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

    from memfit.cli.app import VERBOSE
    from memfit.cli.noise import LibraryNoise

    command = typer.main.get_command(app)
    _forbid_blank_values(command)
    noise = LibraryNoise.install()
    try:
        rc = _run(command)
    finally:
        noise.uninstall()
        noise.report(verbose=VERBOSE["on"])
        VERBOSE["on"] = False
    if isinstance(rc, int) and rc:
        sys.exit(rc)


def _run(command):
    """The command, with every way it can end made one of: a return code, ``SystemExit``, or a
    ``memfit: error:`` line and exit status 2 (never a traceback for bad input)."""
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
    return rc
