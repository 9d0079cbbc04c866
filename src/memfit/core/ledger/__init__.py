"""The memory ledger: the training libraries' allocations replayed on paper, phase by phase.

Shared by every framework: ``timeline`` (the event log of allocations and frees, and the peaks per
phase), ``lean_timeline`` (the same, keeping only what a verdict needs), ``context`` (the scenario
reduced to the numbers the allocation code uses), ``host_process`` (the process around the tensors)
and ``build`` (which framework's recipes run, in the order of the real code). One folder per
framework: ``deepspeed/`` (``from_pretrained`` and ``deepspeed.initialize``: load, cast, move, ZeRO
0-3, the steps) and ``pytorch/`` (a plain PyTorch loop or the Trainer, DDP, FSDP1/FSDP2).
"""
