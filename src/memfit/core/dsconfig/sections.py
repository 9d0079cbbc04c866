"""The top level of a DeepSpeed config: which keys DeepSpeed 0.19.8 reads, refuses or ignores.

``DeepSpeedConfig`` (``runtime/config.py``) is not a pydantic model: it reads the top-level keys it
knows and ignores every other one, so a misspelled section (``zero_optimisation``) silently leaves
DeepSpeed's defaults in place. memfit says so (a warning, with the key it most likely meant).
Inside a section the rules differ by how DeepSpeed reads it:

- ``STRICT_SECTIONS``: read by a ``DeepSpeedConfigModel`` (``extra="forbid"``) that memfit does not
  otherwise interpret; an unknown key is refused there, so memfit refuses it too. (The sections
  memfit reads itself, ``zero_optimization``, ``fp16`` and ``bf16``, are checked in ``validate``.)
- ``LOOSE_SECTIONS``: read with ``dict.get``; an unknown key is ignored, so memfit warns.
- ``OPAQUE_SECTIONS``: objects memfit does not look inside (their keys do not change memory).

Every table is compared with DeepSpeed's own models and reading code in
tests/exact/test_dsconfig_against_deepspeed.py, which also checks, config by config, that memfit
refuses what DeepSpeed refuses and warns about what DeepSpeed ignores.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from memfit.errors import MemfitError

STRICT_SECTIONS: dict[str, frozenset[str]] = {
    "tensorboard": frozenset({"enabled", "job_name", "output_path"}),
    "csv_monitor": frozenset({"enabled", "job_name", "output_path"}),
    "wandb": frozenset({"enabled", "group", "project", "team"}),
    "comet": frozenset({"api_key", "enabled", "experiment_key", "experiment_name", "mode", "online", "project",
                        "samples_log_interval", "workspace"}),
    "comms_logger": frozenset({"debug", "enabled", "prof_all", "prof_ops", "verbose"}),
    "compile": frozenset({"autoep_non_moe", "debug_log", "deepcompile", "double_buffer", "free_activation",
                          "free_activation_threshold", "keep_all_input_tensors", "keep_int_input_tensors",
                          "offload_activation", "offload_activation_pin_memory", "offload_opt_states",
                          "offload_parameters", "passes", "symmetric_memory", "sync_after_allgather",
                          "sync_after_reduce", "sync_before_allgather", "sync_before_reduce"}),
    "hybrid_engine": frozenset({"enable_cuda_graph", "enabled", "inference_tp_size", "max_out_tokens",
                                "pin_parameters", "release_inference_cache", "tp_gather_partition_size"}),
    "tensor_parallel": frozenset({"autotp_size", "dtype", "injection_policy_tuple", "keep_module_on_host",
                                  "kernel_inject", "partition_config", "preset_model", "replace_with_kernel_inject",
                                  "tensor_parallel", "tp", "tp_overlap_comm", "vocab_parallel_ce_backend",
                                  "vocab_parallel_lm_head"}),
    "weight_quantization": frozenset({"enabled", "num_bits", "post_init_quant", "q_groups", "q_type",
                                      "quantized_initialization"}),
}
"""Field names and aliases of ``monitor/config.py: TensorBoardConfig, CSVConfig, WandbConfig,
CometConfig``, ``comm/config.py: CommsLoggerConfig``, ``compile/config.py: CompileConfig``,
``runtime/config.py: HybridEngineConfig``, ``runtime/tensor_parallel/config.py: TPTrainingConfig``,
``inference/config.py: WeightQuantConfig``."""

LOOSE_SECTIONS: dict[str, frozenset[str]] = {
    "optimizer": frozenset({"type", "params", "legacy_fusion"}),
    "scheduler": frozenset({"type", "params"}),
    "data_types": frozenset({"grad_accum_dtype", "param_dtype", "buffer_dtype", "keep_in_fp32_modules"}),
    "activation_checkpointing": frozenset({"partition_activations", "number_checkpoints",
                                           "contiguous_memory_optimization", "synchronize_checkpoint_boundary",
                                           "profile", "cpu_checkpointing"}),
    "flops_profiler": frozenset({"enabled", "recompute_fwd_factor", "profile_step", "module_depth", "top_modules",
                                 "detailed", "output_file"}),
    "aio": frozenset({"block_size", "queue_depth", "intra_op_parallelism", "single_submit", "overlap_events",
                      "use_gds"}),
    "torch_autocast": frozenset({"enabled", "dtype", "lower_precision_safe_modules"}),
}
"""Sections DeepSpeed reads key by key (``runtime/constants.py`` OPTIMIZER/SCHEDULER/DATA_TYPES/
TORCH_AUTOCAST keys, ``activation_checkpointing/config.py`` ACT_CHKPT_*, ``profiling/constants.py``
FLOPS_PROFILER_*, ``swap_tensor/constants.py`` AIO_*): an unknown key is ignored."""

OPAQUE_SECTIONS = frozenset({"checkpoint", "autotuning", "pipeline", "data_efficiency", "expert_parallel",
                             "timers", "datastates", "zenflow", "swap_tensor"})
"""Objects memfit passes to DeepSpeed without looking inside."""

SCALAR_KEYS = frozenset({
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
    "communication_data_type", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "steps_per_print",
    "wall_clock_breakdown", "memory_breakdown", "prescale_gradients", "gradient_predivide_factor",
    "allgather_size", "dump_state", "seq_parallel_communication_data_type", "dataloader_drop_last",
    "disable_allgather", "managed_gradient_accumulation", "gradient_allreduce_op", "vocabulary_size", "log_level",
    "use_data_before_expert_parallel_", "sequence_parallel_size", "disable_python_gc", "optimizer_legacy_fusion"})
"""Top-level values DeepSpeed reads (``DeepSpeedConfig._initialize_params``)."""

READ_BY_MEMFIT = frozenset({"zero_optimization", "fp16", "bf16", "bfloat16"})
"""Sections ``validate`` checks field by field against DeepSpeed's models."""

KNOWN_TOP_LEVEL = frozenset(STRICT_SECTIONS) | frozenset(LOOSE_SECTIONS) | OPAQUE_SECTIONS | SCALAR_KEYS | READ_BY_MEMFIT
"""Every top-level key DeepSpeed 0.19.8 reads."""

_MEANING = {
    "zero_optimization": "ZeRO stage 0 (no partitioning, no offload)",
    "fp16": "fp16 off", "bf16": "bf16 off", "optimizer": "no optimizer from the config",
    "train_micro_batch_size_per_gpu": "the micro batch derived from the other batch keys",
    "gradient_accumulation_steps": "gradient accumulation derived from the other batch keys",
}


def did_you_mean(key: str, known: object, *, cutoff: float = 0.75) -> str | None:
    """The known key ``key`` most likely misspells (case and ``-``/``_``/spelling variants), if any."""
    names = sorted(known)  # type: ignore[call-overload]
    norm = {n.lower().replace("-", "_").replace("optimis", "optimiz"): n for n in names}
    k = key.lower().replace("-", "_").replace("optimis", "optimiz")
    if k in norm:
        return norm[k]
    close = difflib.get_close_matches(k, list(norm), n=1, cutoff=cutoff)
    return norm[close[0]] if close else None


def check_sections(cfg: Mapping[str, object], warnings: list[str]) -> None:
    """Refuse what DeepSpeed refuses at the top level and in ``STRICT_SECTIONS``; append one line
    to ``warnings`` for each key DeepSpeed ignores (top level and ``LOOSE_SECTIONS``)."""
    for key, value in cfg.items():
        if key in STRICT_SECTIONS or key in LOOSE_SECTIONS:
            if value is None and key in LOOSE_SECTIONS:
                continue
            if not isinstance(value, Mapping):
                raise MemfitError(f"DeepSpeed config {key} must be an object, got {value!r:.60} (DeepSpeed fails on it)")
            table = STRICT_SECTIONS.get(key) or LOOSE_SECTIONS[key]
            for sub in value:
                if sub in table:
                    continue
                close = did_you_mean(sub, table)
                hint = f" (did you mean {close!r}?)" if close else ""
                if key in STRICT_SECTIONS:
                    raise MemfitError(f"DeepSpeed config {key}.{sub}: unknown key{hint}; DeepSpeed forbids unknown "
                                      "keys in this section")
                warnings.append(f"DeepSpeed config {key}.{sub}: not a key DeepSpeed 0.19.8 reads{hint}; DeepSpeed "
                                "ignores it")
        elif key in OPAQUE_SECTIONS and value is not None and not isinstance(value, Mapping):
            raise MemfitError(f"DeepSpeed config {key} must be an object, got {value!r:.60}")
        elif key not in KNOWN_TOP_LEVEL:
            close = did_you_mean(key, KNOWN_TOP_LEVEL)
            if close:
                effect = f": the plan uses {_MEANING[close]}" if close in _MEANING and close not in cfg else ""
                warnings.append(f"DeepSpeed config {key!r} is not a DeepSpeed key (did you mean {close!r}?); DeepSpeed "
                                f"ignores it{effect}")
            else:
                warnings.append(f"DeepSpeed config {key!r} is not a DeepSpeed 0.19.8 key; DeepSpeed ignores it")
