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
- ``from_pretrained``'s dtype when none is given: ``load_dtype_default``.
- the Trainer's ``optim``: ``"adamw_hf"`` (transformers' own ``AdamW``) up to 4.31;
  ``"adamw_torch"`` from 4.32 (``default_optim = "adamw_torch"``); from 4.54 ``"adamw_torch_fused"``
  when torch >= 2.8 (4.54.0 ``training_args.py``: ``if is_torch_greater_or_equal_than_2_8:
  default_optim = "adamw_torch_fused"``).
- ``fsdp_config.cpu_ram_efficient_loading``: read by TrainingArguments from 4.41 (default false),
  not before (``trainer_reads_cpu_ram_efficient_loading``).
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


def load_dtype_default(line: str | None, *, config_dtype: str | None, quantized: bool) -> tuple[str, str]:
    """The dtype ``from_pretrained`` loads in when the script passes none (memfit's name, why):

    - 5.0 on: ``if dtype is None: dtype = "auto"`` (5.24 modeling_utils.py ``from_pretrained``), which
      ``_get_dtype`` reads as config.json's ``dtype`` (``torch_dtype``), else the checkpoint's first
      floating-point weight (memfit reads no weights: fp32, said); a bitsandbytes quantizer keeps it
      (5.24 ``HfQuantizer.update_dtype`` returns it);
    - up to 4.57: ``torch.get_default_dtype()``, fp32 (4.26.0, 4.31.0, 4.40.0, 4.57.0 read), except a
      bitsandbytes load, forced to float16 (4.26.0 line 2053 for 8-bit; 4.31.0 line 2291 'Overriding
      torch_dtype=None with torch_dtype=torch.float16 due to requirements of bitsandbytes'; 4.40.0 and
      4.57.0 ``quantizer_bnb_4bit.py``/``quantizer_bnb_8bit.py`` ``update_torch_dtype``/``update_dtype``).
    ``config_dtype``: memfit's name of config.json's dtype (None when the config gives none)."""
    if line is not None and at_least(line, "5.0"):
        if config_dtype:
            return config_dtype, (f"transformers {line}: from_pretrained without dtype loads dtype='auto' "
                                  f"(since 5.0), config.json's {config_dtype}")
        return "fp32", (f"transformers {line}: dtype='auto' (since 5.0) and config.json gives no dtype, so the "
                        "checkpoint's first floating-point weight decides, which memfit does not read: fp32 assumed")
    if line is not None and quantized:
        return "fp16", (f"transformers {line}: a bitsandbytes load without torch_dtype is cast to float16 "
                        "('Overriding torch_dtype=None with torch_dtype=torch.float16', up to 4.57)")
    if line is None:
        return "fp32", "no transformers: torch's default dtype (fp32)"
    return "fp32", f"transformers {line}: from_pretrained's torch.get_default_dtype() (fp32, up to 4.57)"


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


def trainer_reads_cpu_ram_efficient_loading(line: str | None) -> tuple[bool, str]:
    """Whether TrainingArguments reads ``fsdp_config.cpu_ram_efficient_loading`` (with ``fsdp`` set):
    from 4.41 it does, default ``"false"``, and writes ``FSDP_CPU_RAM_EFFICIENT_LOADING`` over what
    ``accelerate launch`` set (4.41.0 ``training_args.py`` lines 1864-1872; 5.24 the same, line
    2847); 4.36.0 and 4.40.0 have no such key: the variable is the launcher's (an accelerate config),
    unset under torchrun, where accelerate's plugin reads it as False."""
    if line is None or at_least(line, "4.41"):
        return True, (f"transformers {line or '5'}: TrainingArguments sets FSDP_CPU_RAM_EFFICIENT_LOADING from "
                      "fsdp_config.cpu_ram_efficient_loading (default false; since 4.41)")
    return False, (f"transformers {line}: TrainingArguments does not read fsdp_config.cpu_ram_efficient_loading "
                   "(from 4.41 it does); FSDP_CPU_RAM_EFFICIENT_LOADING is the launcher's: an accelerate config's "
                   "value, else unset, which accelerate reads as false")


def fsdp_efficient_loading(line: str | None, *, quantized: bool) -> tuple[str, str]:
    """How ``from_pretrained`` loads under accelerate's FSDP ``cpu_ram_efficient_loading``
    (``is_fsdp_enabled()``: ``ACCELERATE_USE_FSDP`` and ``FSDP_CPU_RAM_EFFICIENT_LOADING`` set by
    ``accelerate launch``), as (mode, why):

    - ``rank0_host``: rank 0 reads the weights into host memory, every other rank builds the model
      on the meta device (4.36.0 ``modeling_utils.py:load_state_dict``: ``map_location = "meta"`` when
      ``is_fsdp_enabled() and not is_local_dist_rank_0()``; 4.35 only set low_cpu_mem_usage; 5.x
      keeps it: ``_move_missing_keys_from_meta_to_device`` skips non-rank-0 of a non-quantized model);
    - ``rank0_host_quantized`` (a bitsandbytes base, 4.45-4.57): each weight is quantized on the GPU
      (the quantizer's ``device_map = {"": current_device}``) and its packed storage then moved to
      rank 0's host, to meta elsewhere (``_load_state_dict_into_meta_model``: "quantize the parameter
      on the GPU and then cast it to CPU", ``param_to = "meta"`` off rank 0 since 4.45); the
      quantization state stays on the GPU;
    - ``every_rank_host_quantized`` (4.39-4.44): the same, but every rank keeps the packed storage in
      its own host memory (4.39.0: ``value.data.to("cpu")`` on all ranks);
    - ``every_rank``: no FSDP path: a bitsandbytes base is quantized onto every rank's GPU as on one
      GPU (before 4.39, and in 5.x, which dropped that branch), other models load on every rank.
    """
    if line is None:
        return "every_rank", "transformers not installed"
    if quantized:
        if at_least(line, "4.45") and not at_least(line, "5.0"):
            return "rank0_host_quantized", (f"transformers {line}: under FSDP's cpu_ram_efficient_loading each weight is "
                                            "quantized on the GPU, its packed storage moved to rank 0's host (meta "
                                            "elsewhere), the quantization state kept on the GPU (4.45-4.57)")
        if at_least(line, "4.39") and not at_least(line, "5.0"):
            return "every_rank_host_quantized", (f"transformers {line}: under FSDP each weight is quantized on the GPU and "
                                                 "its packed storage moved to every rank's host (4.39-4.44; rank 0 "
                                                 "only from 4.45)")
        return "every_rank", (f"transformers {line}: a bitsandbytes model loads onto every rank's GPU (device_map "
                              "current device), cpu_ram_efficient_loading or not"
                              + (" (its FSDP branch arrived in 4.39)" if not at_least(line, "4.39") else
                                 " (5.x dropped the FSDP branch of 4.39-4.57)"))
    if at_least(line, "4.36"):
        return "rank0_host", (f"transformers {line}: only rank 0 reads the weights; the other ranks build the model on "
                              "the meta device (cpu_ram_efficient_loading, since 4.36)")
    return "every_rank", f"transformers {line}: every rank loads the weights (rank-0-only loading arrived in 4.36)"


def bnb_reads_quant_storage(line: str | None) -> tuple[bool, str]:
    """Whether ``BitsAndBytesConfig`` reads ``bnb_4bit_quant_storage``: from transformers 4.39.0
    (``utils/quantization_config.py``: the argument and ``self.bnb_4bit_quant_storage``). 4.38.2's
    ``__init__`` takes it into ``**kwargs`` and drops it without a word, so the packed weights stay
    ``uint8`` (``Params4bit``'s storage)."""
    if line is None or at_least(line, "4.39"):
        return True, ""
    return False, (f"transformers {line}'s BitsAndBytesConfig has no bnb_4bit_quant_storage (it arrived in 4.39.0; "
                   "4.38 drops it with its other unknown keyword arguments): the packed 4-bit weights are uint8")
