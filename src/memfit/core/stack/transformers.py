"""transformers' defaults that change host and GPU memory, per release line.

Read from the released wheels' ``modeling_utils.py`` and ``training_args.py`` (4.15.0, 4.20.0,
4.26.0, 4.30.0-4.41.0, 4.45.0, 4.48.1, 4.50.0, 4.51.0, 4.53.0-4.57.0, 5.0.0; 5.24.0 installed):

- ``from_pretrained``'s ``low_cpu_mem_usage``: ``kwargs.pop("low_cpu_mem_usage", False)`` up to
  4.19 (4.15.0 line 1249); from 4.20 ``None``, which means False unless a ``device_map`` is given
  (4.20.0 line 1891: ``if device_map is not None: if low_cpu_mem_usage is None:
  low_cpu_mem_usage = True``), the model is quantized (4.30.0 line 2283, bitsandbytes sets a
  device_map), or, from 4.35, accelerate's FSDP efficient loading is on (4.35.0 line 2566: ``if
  is_fsdp_enabled(): low_cpu_mem_usage = True``); from 4.51 the argument is dropped (4.51.0:
  ``_ = kwargs.pop("low_cpu_mem_usage", None)``): every model is built on the meta device and the
  checkpoint's tensors become its weights, and transformers 5 does the same. Without it the
  weights of a randomly initialized model and the state dict of the shard being loaded are alive
  together (4.15.0 lines 1364-1462: ``torch.load`` of the checkpoint, then ``cls(config)``, then
  ``_load_state_dict_into_model``); ``core/ledger/*/load`` books that.
- the Trainer's ``optim``: ``"adamw_hf"`` (transformers' own ``AdamW``) up to 4.31;
  ``"adamw_torch"`` from 4.32 (``default_optim = "adamw_torch"``); from 4.54 ``"adamw_torch_fused"``
  when torch >= 2.8 (4.54.0 ``training_args.py``: ``if is_torch_greater_or_equal_than_2_8:
  default_optim = "adamw_torch_fused"``).
- ``gradient_checkpointing_kwargs`` (a TrainingArguments field from 4.35): left out, 4.35-4.37 call
  ``torch.utils.checkpoint`` with torch's own default (``use_reentrant=True``, with a warning),
  4.38-4.57 pass ``{"use_reentrant": True}`` (``modeling_utils.py:gradient_checkpointing_enable``),
  5.0 ``{"use_reentrant": False}``. memfit's activation model keeps the same tensors for both (the
  block's input, recomputed in backward); the value is said, not booked differently.
"""

from __future__ import annotations

from memfit.core.stack.releases import at_least

SRC = "transformers modeling_utils.py:PreTrainedModel.from_pretrained"


def low_cpu_mem_usage_default(line: str | None, *, device_map: bool, quantized: bool,
                              fsdp_efficient: bool) -> tuple[bool, str]:
    """What ``from_pretrained`` does when the script does not pass ``low_cpu_mem_usage``: (value,
    why, with the release and code)."""
    if line is None:
        return True, "transformers not installed: the model is built as memfit's default loading path"
    if at_least(line, "4.51"):
        return True, (f"transformers {line} builds every model on the meta device and loads the checkpoint into it "
                      f"(the low_cpu_mem_usage argument is dropped since 4.51)")
    if not at_least(line, "4.20"):
        return False, f"transformers {line}: from_pretrained's default low_cpu_mem_usage=False (until 4.19)"
    if quantized:
        return True, f"transformers {line}: a quantized load sets device_map, which sets low_cpu_mem_usage=True"
    if device_map:
        return True, f"transformers {line}: a device_map sets low_cpu_mem_usage=True"
    if fsdp_efficient and at_least(line, "4.35"):
        return True, (f"transformers {line}: accelerate's FSDP cpu_ram_efficient_loading (is_fsdp_enabled) sets "
                      "low_cpu_mem_usage=True")
    return False, (f"transformers {line}: low_cpu_mem_usage=None reads as False without a device_map "
                   "(4.20-4.50)")


def honours_low_cpu_mem_usage_false(line: str | None) -> bool:
    """``low_cpu_mem_usage=False`` still builds a random model next to the state dict (not from 4.51)."""
    return line is None or not at_least(line, "4.51")


def trainer_default_optim(line: str | None, torch_line: str) -> tuple[str, str]:
    """The Trainer's ``optim`` when TrainingArguments leaves it out: (optim, why)."""
    if line is None or at_least(line, "4.54"):
        if at_least(torch_line, "2.8"):
            return "adamw_torch_fused", (f"the Trainer's default optim in transformers {line or 'its current release'} "
                                         f"on torch {torch_line} (>= 2.8: adamw_torch_fused; training_args.py)")
        return "adamw_torch", f"the Trainer's default optim in transformers {line} on torch {torch_line} (< 2.8)"
    if at_least(line, "4.32"):
        return "adamw_torch", f"the Trainer's default optim in transformers {line} (4.32-4.53: adamw_torch)"
    return "adamw_hf", f"the Trainer's default optim in transformers {line} (until 4.31: adamw_hf, transformers' AdamW)"


def checkpointing_reentrant(line: str | None) -> tuple[bool, str]:
    """``use_reentrant`` of the Trainer's gradient checkpointing when no kwargs are given."""
    if line is None or at_least(line, "5.0"):
        return False, f"transformers {line or '5'}: gradient_checkpointing_enable passes use_reentrant=False"
    if at_least(line, "4.38"):
        return True, f"transformers {line}: gradient_checkpointing_enable passes use_reentrant=True (4.38-4.57)"
    return True, f"transformers {line}: torch.utils.checkpoint's own default (use_reentrant=True)"
