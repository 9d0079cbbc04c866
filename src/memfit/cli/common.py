"""What every command shares: the consoles, the inputs warnings, writing new files and reports, and the
trace's progress display. Heavy imports stay inside the functions."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from memfit.errors import MemfitError


def console(stderr: bool = False):
    """Console for every command's output. ``markup=False``: a scenario name, model or path that
    looks like rich markup (``[/bold]``) is printed as written, never interpreted."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, markup=False)


def warn_inputs(sc) -> None:
    """Print what memfit resolved or DeepSpeed would ignore in the inputs, one line each, on stderr
    (the plan's findings carry them too)."""
    for w in sc.deepspeed.warnings:
        print(f"memfit: warning: {w}", file=sys.stderr)


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


def write_report(path: Path, result, sc, *, title: str | None = None, render=None, heading: str = "") -> None:
    """Write the plan's report; ``render(console)`` (a terminal renderer) adds a section first."""
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
        out = html_report(result, sc, sections=html_sections, title=title)
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
