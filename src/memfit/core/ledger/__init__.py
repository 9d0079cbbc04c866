"""The memory ledger: DeepSpeed's allocations replayed on paper, phase by phase.

``timeline`` is the bookkeeping (allocate, free, peaks per phase); ``load``, ``zero3``,
``zero012`` and ``step`` are the recipes, each mirroring one part of the real code path.
"""
