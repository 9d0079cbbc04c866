"""The software stack of a run: which release of torch, CUDA, DeepSpeed, transformers, peft,
bitsandbytes, accelerate and TRL it used, and what changed between releases.

- ``releases``: the libraries, the release lines memfit knows, their defaults;
- ``types``: ``Stack`` and ``StackEntry`` (version, line, where it came from, assumed or not);
- ``resolve``: the stack from flags, the scenario's ``stack:`` section and stack files;
- ``transformers``, ``deepspeed``, ``torch_optim``: the defaults and allocation rules that follow a
  release, each citing the release and code that changed it.
"""
