"""The ``memfit`` command line: one module per command (its options and help beside its handler),
``common`` for what they share, ``application`` for the Typer application they register with. Heavy
imports stay inside the handlers, so ``memfit --help`` and ``memfit plan`` start fast, and ``main``
imports only the module of the command that runs (every module for ``memfit --help``, no command, or
a name that is no command, so that the help and the errors list every command).

``memfit.cli.app`` is the whole application, every command registered (a test's ``CliRunner``)."""

from __future__ import annotations

import gc
import importlib
import sys

from memfit.errors import MemfitError

__all__ = ["COMMANDS", "app", "main", "register_commands", "run"]

COMMANDS = {"plan": "plan", "trace": "trace", "replay": "replay", "recommend": "recommend", "diagnose": "diagnose",
            "compare": "compare", "models": "catalog", "zero-paper": "catalog"}
"""Each command and the module that registers it, in the order ``memfit --help`` lists them."""

_MODULES = tuple(dict.fromkeys(COMMANDS.values()))
_GLOBAL_FLAGS = ("--verbose",)
"""The application's own options that take no value and can come before the command (``--version``
and ``--help`` print and exit: every command is registered for them)."""


GC_FIRST_GENERATION = 100_000
"""The collector's first-generation threshold while a command runs (Python's default is 700). Start-up
and a plan create objects that live to the end (modules, classes, the ledger), which every collection
of the default schedule scans again: measured with ``gc.callbacks``, 86 collections and 13-20 ms of CPU
for the seed's plan, 120-130 and 40-55 ms for the 70B FSDP2 and the QLoRA examples, 150 ms for the
seed's recommend. A plan allocates fewer than 100,000 container objects (those cases: 60,000-85,000),
so it runs no collection; a longer command (recommend, a trace) still collects, every 100,000
allocations, so cyclic garbage stays bounded (the seed's recommend: the same peak RSS, 57-58 MiB).
``main`` restores the caller's threshold when it returns; ``run``, the process's entry point, keeps it
to the exit."""


def register_commands(names=None):
    """The Typer application with the commands ``names`` registered (every command when None), in
    ``COMMANDS``' order whatever order their modules were imported in."""
    from memfit.cli.application import app

    for module in _MODULES if names is None else dict.fromkeys(COMMANDS[n] for n in names):
        importlib.import_module(f"memfit.cli.{module}")
    order = {f"memfit.cli.{m}": i for i, m in enumerate(_MODULES)}
    app.registered_commands.sort(key=lambda info: order.get(getattr(info.callback, "__module__", ""), len(order)))
    for info in app.registered_commands:
        if info.help is None and info.callback is not None and info.callback.__doc__:
            info.help = unwrap_help(info.callback.__doc__)
    return app


def unwrap_help(doc: str) -> str:
    """A command's docstring as its help: each paragraph's source line breaks joined into one line
    (Typer's rich mode prints a docstring's single line breaks as they are, so the 100-column source
    lines broke mid-sentence in ``--help``); blank lines still separate paragraphs."""
    import inspect

    return "\n\n".join(" ".join(line.strip() for line in para.splitlines())
                        for para in inspect.cleandoc(doc).split("\n\n"))


def __getattr__(name: str):
    if name == "app":
        return register_commands()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def command_to_run(argv: list[str]) -> str | None:
    """The command ``argv`` (the arguments after ``memfit``) names, or None where it names none of
    ``COMMANDS`` (no command, ``--help``, ``--version``, an unknown option or a misspelt name)."""
    for arg in argv:
        if arg in _GLOBAL_FLAGS:
            continue
        return arg if arg in COMMANDS else None
    return None


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
    threshold = gc.get_threshold()
    gc.set_threshold(GC_FIRST_GENERATION, *threshold[1:])  # imports included
    try:
        import typer.main

        from memfit.cli.application import VERBOSE
        from memfit.cli.noise import LibraryNoise

        name = command_to_run(sys.argv[1:])
        command = typer.main.get_command(register_commands(None if name is None else [name]))
        _forbid_blank_values(command)
        noise = LibraryNoise.install()
        try:
            rc = _run(command)
        finally:
            noise.uninstall()
            noise.report(verbose=VERBOSE["on"])
            VERBOSE["on"] = False
    finally:
        gc.set_threshold(*threshold)
    if isinstance(rc, int) and rc:
        sys.exit(rc)


def run() -> None:
    """The process's entry point (the ``memfit`` console script, ``python -m memfit.cli``): ``main``,
    with the raised threshold kept to the exit (restoring it would run, as the process exits, the
    scans ``main`` spared: measured 15-18 ms for the seed's plan) and the objects left frozen
    (``gc.freeze``) so that the interpreter's last collection at shutdown does not scan them either
    (8 ms for the seed's plan). The process ends there: nothing it leaves uncollected is needed back."""
    gc.set_threshold(GC_FIRST_GENERATION, *gc.get_threshold()[1:])
    try:
        main()
    finally:
        gc.freeze()


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
