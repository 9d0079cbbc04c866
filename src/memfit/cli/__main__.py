"""``python -m memfit.cli``: the console script's entry point."""

from memfit.cli import main

main()
