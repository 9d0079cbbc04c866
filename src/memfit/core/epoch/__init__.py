"""The epoch simulation (issue 19 item 1): many steady-state steps of the batch shapes a dataset
gives, through one CUDA caching allocator whose cache carries from step to step.

- ``shapes.py``: the batch lengths of an epoch (pad-longest, group_by_length buckets, packing), and
  memfit's stated default distribution;
- ``template.py``: one step's alloc/free events at any length, fitted from the recipes' timelines;
- ``simulate.py``: the epoch through the allocator (memo, event budget, empty_cache cadence), its
  summary and the peak step as phases;
- ``words.py``: the summary in words.
"""
