"""``python -m memfit.cli``: the console script's entry point (``run``: ``main`` as the process that exits after it)."""

from memfit.cli import run

run()
