"""The key names the libraries themselves accept in each input file, so that memfit refuses or warns
about a key exactly where the library would (with the key it most likely misspells).

They are copied here because the pure core imports no transformers, accelerate or trl;
``tests/exact/test_input_keys_against_libraries.py`` reads each list from the installed library
and fails when they differ (trl is checked when it is installed).
"""

from __future__ import annotations

TRAINING_ARGS_KEYS = frozenset({
    "accelerator_config", "activation_checkpointing", "activation_checkpointing_kwargs", "adam_beta1", "adam_beta2",
    "adam_epsilon", "auto_find_batch_size", "average_tokens_across_devices", "batch_eval_metrics", "bf16",
    "bf16_full_eval", "data_seed", "dataloader_drop_last", "dataloader_in_order", "dataloader_multiprocessing_context",
    "dataloader_num_workers", "dataloader_persistent_workers", "dataloader_pin_memory", "dataloader_prefetch_factor",
    "ddp_backend", "ddp_broadcast_buffers", "ddp_bucket_cap_mb", "ddp_find_unused_parameters", "ddp_static_graph",
    "ddp_timeout", "debug", "deepspeed", "disable_tqdm", "do_eval", "do_predict", "do_train", "enable_jit_checkpoint",
    "eval_accumulation_steps", "eval_delay", "eval_do_concat_batches", "eval_on_start", "eval_steps", "eval_strategy",
    "eval_use_gather_object", "fp16", "fp16_full_eval", "fsdp", "fsdp_config", "full_determinism",
    "gradient_accumulation_steps", "gradient_checkpointing", "gradient_checkpointing_kwargs", "greater_is_better",
    "hub_always_push", "hub_model_id", "hub_private_repo", "hub_revision", "hub_strategy", "hub_token",
    "ignore_data_skip", "include_for_metrics", "include_num_input_tokens_seen", "label_names",
    "label_smoothing_factor", "learning_rate", "length_column_name", "liger_kernel_config", "load_best_model_at_end",
    "local_rank", "log_level", "log_level_replica", "log_on_each_node", "logging_first_step",
    "logging_nan_inf_filter", "logging_steps", "logging_strategy", "lr_scheduler_kwargs", "lr_scheduler_type",
    "max_grad_norm", "max_steps", "metric_for_best_model", "neftune_noise_alpha", "num_train_epochs", "optim",
    "optim_args", "optim_target_modules", "output_dir", "parallelism_config", "per_device_eval_batch_size",
    "per_device_train_batch_size", "prediction_loss_only", "project", "push_to_hub", "remove_unused_columns",
    "report_to", "restore_callback_states_from_checkpoint", "resume_from_checkpoint", "run_name",
    "save_on_each_node", "save_only_model", "save_steps", "save_strategy", "save_total_limit", "seed",
    "skip_memory_metrics", "tf32", "torch_compile", "torch_compile_backend", "torch_compile_mode",
    "torch_empty_cache_steps", "trackio_bucket_id", "trackio_space_id", "trackio_static_space_id",
    "train_sampling_strategy", "use_cache", "use_cpu", "use_liger_kernel", "warmup_steps", "weight_decay",
})
"""``dataclasses.fields(transformers.TrainingArguments)``, transformers 5.24. ``TrainingArguments(**d)``
and ``HfArgumentParser.parse_json_file`` refuse any other key."""

SEQ2SEQ_TRAINING_ARGS_KEYS = frozenset({"generation_config", "generation_max_length", "generation_num_beams",
                                        "predict_with_generate", "sortish_sampler"})
"""``Seq2SeqTrainingArguments``' fields beyond ``TrainingArguments``' (transformers 5.24)."""

TRAINING_ARGS_TYPES: dict[str, tuple[str, ...]] = {
    **dict.fromkeys((
        "auto_find_batch_size", "average_tokens_across_devices", "batch_eval_metrics", "bf16", "bf16_full_eval",
        "dataloader_drop_last", "dataloader_in_order", "dataloader_persistent_workers", "dataloader_pin_memory",
        "do_eval", "do_predict", "do_train", "enable_jit_checkpoint", "eval_do_concat_batches", "eval_on_start",
        "eval_use_gather_object", "fp16", "fp16_full_eval", "full_determinism", "hub_always_push", "ignore_data_skip",
        "load_best_model_at_end", "log_on_each_node", "logging_first_step", "logging_nan_inf_filter",
        "predict_with_generate", "prediction_loss_only", "push_to_hub", "remove_unused_columns",
        "restore_callback_states_from_checkpoint", "save_on_each_node", "save_only_model", "skip_memory_metrics",
        "sortish_sampler", "torch_compile", "use_cache", "use_cpu", "use_liger_kernel"), ("bool",)),
    **dict.fromkeys((
        "activation_checkpointing", "ddp_broadcast_buffers", "ddp_find_unused_parameters", "ddp_static_graph",
        "disable_tqdm", "gradient_checkpointing", "greater_is_better", "hub_private_repo", "tf32"), ("bool", "null")),
    **dict.fromkeys((
        "dataloader_num_workers", "ddp_timeout", "gradient_accumulation_steps", "local_rank", "max_steps",
        "per_device_eval_batch_size", "per_device_train_batch_size", "seed"), ("int",)),
    **dict.fromkeys((
        "data_seed", "dataloader_prefetch_factor", "ddp_bucket_cap_mb", "eval_accumulation_steps",
        "generation_max_length", "generation_num_beams", "save_total_limit", "torch_empty_cache_steps"),
        ("int", "null")),
    **dict.fromkeys((
        "adam_beta1", "adam_beta2", "adam_epsilon", "eval_delay", "label_smoothing_factor", "learning_rate",
        "logging_steps", "max_grad_norm", "num_train_epochs", "save_steps", "warmup_steps", "weight_decay"),
        ("float", "int")),
    **dict.fromkeys(("eval_steps", "neftune_noise_alpha"), ("float", "int", "null")),
    **dict.fromkeys((
        "eval_strategy", "hub_strategy", "length_column_name", "log_level", "log_level_replica", "logging_strategy",
        "lr_scheduler_type", "optim", "project", "save_strategy", "train_sampling_strategy"), ("str",)),
    **dict.fromkeys((
        "dataloader_multiprocessing_context", "ddp_backend", "fsdp", "hub_model_id", "hub_revision", "hub_token",
        "metric_for_best_model", "optim_args", "output_dir", "resume_from_checkpoint", "run_name",
        "torch_compile_backend", "torch_compile_mode", "trackio_bucket_id", "trackio_space_id"), ("null", "str")),
    **dict.fromkeys((
        "accelerator_config", "activation_checkpointing_kwargs", "deepspeed", "fsdp_config",
        "gradient_checkpointing_kwargs", "lr_scheduler_kwargs"), ("dict", "null", "str")),
    **dict.fromkeys(("optim_target_modules", "report_to"), ("list", "null", "str")),
    "liger_kernel_config": ("dict", "null"), "include_num_input_tokens_seen": ("bool", "str"),
    "trackio_static_space_id": ("bool", "null", "str"), "include_for_metrics": ("list",),
    "label_names": ("list", "null"), "debug": ("list", "str"),
}
"""What JSON each ``Seq2SeqTrainingArguments`` field's annotation admits (transformers 5.24; ``float``
admits ``int``, an ``Enum`` its string value; ``generation_config`` and ``parallelism_config`` are
objects, left out). The dataclass itself checks none of them, and the Trainer fails later, mid-run, on a
wrong one (``{"num_train_epochs": {}}``): memfit refuses it up front (``training_args._field_types``)."""

LEGACY_TRAINING_ARGS_KEYS = frozenset({
    "_n_gpu", "adafactor", "dispatch_batches", "evaluation_strategy", "fp16_backend", "fp16_opt_level",
    "fsdp_min_num_params", "fsdp_transformer_layer_cls_to_wrap", "group_by_length", "half_precision_backend",
    "include_inputs_for_metrics", "include_tokens_per_second", "jit_mode_eval", "logging_dir", "mp_parameters",
    "no_cuda", "overwrite_output_dir", "past_index", "per_gpu_eval_batch_size", "per_gpu_train_batch_size",
    "push_to_hub_model_id", "push_to_hub_organization", "push_to_hub_token", "ray_scope", "save_safetensors",
    "sharded_ddp", "split_batches", "torchdynamo", "tpu_metrics_debug", "tpu_num_cores", "use_ipex",
    "use_legacy_prediction_loop", "use_mps_device", "warmup_ratio",
})
"""``TrainingArguments`` fields of transformers 4.2-4.57 that 5.24 no longer has (read from the
``training_args.py`` of 4.2.0, 4.5.1, 4.6.0, 4.38.2, 4.46.3 and 4.57.1): a file written for an older
release is read, and each such key is named in a note."""

SFT_CONFIG_KEYS = frozenset({
    "model_init_kwargs", "trust_remote_code", "router_aux_loss_coef", "chat_template_path", "dataset_text_field",
    "dataset_kwargs", "dataset_num_proc", "eos_token", "max_length", "truncation_mode", "shuffle_dataset",
    "packing", "packing_strategy", "padding_free", "pad_to_multiple_of", "eval_packing", "completion_only_loss",
    "assistant_only_loss", "loss_type", "activation_offloading", "pad_token",
})
"""TRL 1.16's ``SFTConfig`` fields beyond ``TrainingArguments``'."""

LEGACY_SFT_KEYS = frozenset({"max_seq_length", "dataset_batch_size", "num_of_sequences", "chars_per_token",
                             "use_liger"})
"""``SFTConfig`` fields of TRL 0.12 and 0.19 that 1.16 no longer has (``max_seq_length`` was renamed
``max_length``)."""

ACCELERATE_KEYS = frozenset({
    "command_file", "commands", "compute_environment", "debug", "deepspeed_config", "distributed_type",
    "downcast_bf16", "dynamo_config", "enable_cpu_affinity", "fp8_config", "fsdp_config", "gpu_ids",
    "machine_rank", "main_process_ip", "main_process_port", "main_training_function", "megatron_lm_config",
    "mixed_precision", "mpirun_config", "num_machines", "num_processes", "parallelism_config", "rdzv_backend",
    "same_network", "tpu_env", "tpu_name", "tpu_use_cluster", "tpu_use_sudo", "tpu_vm", "tpu_zone", "use_cpu",
})
"""``dataclasses.fields(accelerate.commands.config.config_args.ClusterConfig)``, accelerate 1.15:
``ClusterConfig.from_yaml_file`` refuses any other top-level key ("had unknown keys")."""

ACCELERATE_FSDP_KEYS = frozenset({
    "fsdp_activation_checkpointing", "fsdp_activation_checkpointing_offload", "fsdp_auto_wrap_policy",
    "fsdp_backward_prefetch", "fsdp_cpu_ram_efficient_loading", "fsdp_forward_prefetch", "fsdp_min_num_params",
    "fsdp_offload_params", "fsdp_reshard_after_forward", "fsdp_sharding_strategy", "fsdp_state_dict_type",
    "fsdp_sync_module_states", "fsdp_transformer_layer_cls_to_wrap", "fsdp_use_orig_params", "fsdp_version",
})
"""``accelerate launch``'s FSDP arguments (accelerate 1.15 ``commands/launch.py``): ``launch`` copies each
``fsdp_config`` key (``fsdp_`` prefixed when it is not) onto its arguments, and reads only these; any
other key is silently dropped."""

ACCELERATE_DEEPSPEED_KEYS = frozenset({
    "deepspeed_config_file", "deepspeed_exclusion_filter", "deepspeed_hostfile", "deepspeed_inclusion_filter",
    "deepspeed_moe_layer_cls_names", "deepspeed_multinode_launcher", "gradient_accumulation_steps",
    "gradient_clipping", "offload_optimizer_device", "offload_optimizer_nvme_path", "offload_param_device",
    "offload_param_nvme_path", "zero3_init_flag", "zero3_save_16bit_model", "zero_stage",
})
"""``accelerate launch``'s DeepSpeed arguments: the ``deepspeed_config`` keys it reads (others dropped)."""

ACCELERATE_DISTRIBUTED_TYPES = ("NO", "MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA",
                                "MULTI_XPU", "MULTI_HPU", "MULTI_NEURON", "DEEPSPEED", "FSDP", "XLA", "MEGATRON_LM")
"""``accelerate.utils.DistributedType`` values (accelerate 1.15)."""

ACCELERATE_MIXED_PRECISION = ("no", "fp8", "fp16", "bf16")
"""``accelerate.utils.PrecisionType`` values."""

BNB_CONFIG_KEYS = frozenset({
    "load_in_8bit", "load_in_4bit", "llm_int8_threshold", "llm_int8_skip_modules", "llm_int8_enable_fp32_cpu_offload",
    "llm_int8_has_fp16_weight", "bnb_4bit_compute_dtype", "bnb_4bit_quant_type", "bnb_4bit_use_double_quant",
    "bnb_4bit_quant_storage",
    # what BitsAndBytesConfig.to_dict() writes besides its arguments
    "quant_method", "_load_in_4bit", "_load_in_8bit",
})
"""``BitsAndBytesConfig.__init__``'s arguments and ``to_dict()``'s keys (transformers 5.24
``utils/quantization_config.py``); any other key is logged as "Unused kwargs" and ignored."""

BNB_QUANT_STORAGE = ("float16", "float32", "int8", "uint8", "float64", "bfloat16")
"""The strings ``BitsAndBytesConfig`` accepts as ``bnb_4bit_quant_storage``."""
