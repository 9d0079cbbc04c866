"""``memfit models`` (the shipped model configs) and ``memfit zero-paper`` (the ZeRO paper's figures)."""

from __future__ import annotations

import typer

from memfit.cli.application import app
from memfit.cli.common import console


@app.command()
def models() -> None:
    """List the shipped model configs (exact parameter counts, no download needed)."""
    from rich.table import Table

    from memfit.core.catalog import list_catalog

    from rich import box

    out = console()
    wide = out.width >= 110  # below that the architecture column is left out (the type names the family)
    t = Table(title="Shipped model configs" + ("" if wide else " (a wider terminal also shows each architecture)"),
              title_justify="left", box=box.SIMPLE, padding=(0, 1), pad_edge=False)
    t.add_column("name", no_wrap=True)  # whole names at any width: the other columns wrap instead
    t.add_column("type", no_wrap=True)
    if wide:
        t.add_column("architecture", no_wrap=True)
    t.add_column("aliases", overflow="fold")
    for e in list_catalog():
        t.add_row(e.name, e.model_type, *([e.architecture] if wide else []), ", ".join(e.aliases))
    out.print(t)


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
    console().print(t)
