"""Mutations of the readers of the user's own files and of the precedence between them, each caught
by a comparison with what transformers, accelerate or bitsandbytes do with the same file."""

from __future__ import annotations

from mutations.model import Mutation

INPUTS_LIBRARY = ("tests/exact/test_precedence_against_libraries.py", "tests/exact/test_inputs_against_libraries.py")
"""The readers and the precedence against TrainingArguments, HfTrainerDeepSpeedConfig, accelerate's
load_config_from_file and BitsAndBytesConfig built from the same files."""

TA, ACC, BNB, PREC, MERGE = ("src/memfit/core/inputs/training_args.py", "src/memfit/core/inputs/accelerate_config.py",
                             "src/memfit/core/inputs/bnb_config.py", "src/memfit/core/inputs/precedence.py",
                             "src/memfit/core/inputs/merge.py")

INPUT_MUTATIONS: tuple[Mutation, ...] = (
    Mutation("ta-micro-default-4", "inputs", TA, 'give("micro_batch", as_int(raw.get(micro_key, 8)',
             'give("micro_batch", as_int(raw.get(micro_key, 4)', INPUTS_LIBRARY,
             "TrainingArguments' per_device_train_batch_size default read as 4 (transformers 5.24: 8)"),
    Mutation("ta-bf16-no-opinion-wins", "inputs", PREC,
             '    if hi.layer == "training_args" and lo.layer == "accelerate_config" and not hi.default:\n'
             '        return ("transformers\' TrainingArguments.__post_init__ sets its mixed precision',
             '    if hi.layer == "accelerate_config" and lo.layer == "training_args":\n'
             '        return ("transformers\' TrainingArguments.__post_init__ sets its mixed precision', INPUTS_LIBRARY,
             "accelerate's mixed_precision taken over TrainingArguments' bf16/fp16 (transformers lets TrainingArguments win)"),
    Mutation("ta-false-bf16-overrides-accelerate", "inputs", TA,
             '        out.set("mixed_precision", "no", where("bf16"), default=True)',
             '        out.set("mixed_precision", "no", where("bf16"))', INPUTS_LIBRARY,
             "TrainingArguments without bf16/fp16 read as 'no mixed precision' over accelerate's (it has no opinion)"),
    Mutation("ds-amp-for-deepspeed", "inputs", MERGE,
             '        chosen = Given("precision", _DS_PRECISION[ta.value], ta.layer, ta.origin, shown=ta.shown)',
             '        chosen = Given("precision", _AMP[ta.value], ta.layer, ta.origin, shown=ta.shown)', INPUTS_LIBRARY,
             "TrainingArguments' bf16 read as autocast under DeepSpeed (the Trainer fills bf16.enabled)"),
    Mutation("bnb-storage-default-bf16", "inputs", BNB, 'storage = raw.get("bnb_4bit_quant_storage") or "uint8"',
             'storage = raw.get("bnb_4bit_quant_storage") or "bfloat16"', INPUTS_LIBRARY,
             "BitsAndBytesConfig's bnb_4bit_quant_storage default read as bfloat16 (transformers: uint8)"),
    Mutation("acc-fsdp-version-default-2", "inputs", ACC, 'version = as_int(fc.get("version", 1), o("fsdp_config.fsdp_version"), maximum=2)',
             'version = as_int(fc.get("version", 2), o("fsdp_config.fsdp_version"), maximum=2)', INPUTS_LIBRARY,
             "an accelerate fsdp_config without fsdp_version read as FSDP2 (accelerate 1.15: FSDP1)"),
    Mutation("ta-unread-key-types-unchecked", "inputs", TA, "    if kinds is None or _admits(value, kinds):",
             "    if True:", ("tests/robustness/test_input_file_reproductions.py",),
             "a TrainingArguments key memfit does not read taken whatever its type ({\"num_train_epochs\": {}}; "
             "the Trainer fails on it mid-run)"),
    Mutation("ta-number-strings-refused", "inputs", TA, '        if "float" in kinds and len(text) <= 64:',
             '        if False:', ("tests/robustness/test_input_file_reproductions.py",),
             "a number written as a string (\"2e-5\", which PyYAML leaves a string and argparse converts) refused for a float field"),
)
