"""Read a user's DeepSpeed JSON into ``DeepSpeedSettings``, the way DeepSpeed 0.19.8 reads it.

Three steps, each mirroring the code that does it for real:

1. ``"auto"`` values are filled as transformers' Trainer fills them (transformers 5.24,
   ``transformers/integrations/deepspeed.py``: ``HfTrainerDeepSpeedConfig.trainer_config_process``
   and ``trainer_config_finalize``), from an ``AutoContext``; a value the Trainer would have to
   invent (or refuse) is a ``MemfitError`` naming the key and the memfit flag that supplies it.
   Where the Trainer finds a written value that disagrees with its own arguments it refuses to start
   ("Please correct the following DeepSpeed config values that mismatch TrainingArguments"); so
   does memfit, for the context values given.
2. Every section DeepSpeed reads through a pydantic model (``zero_optimization`` and its
   ``offload_*`` sections, ``fp16``, ``bf16``) is checked like ``DeepSpeedConfigModel`` checks it
   (``runtime/config_utils.py``): unknown keys are errors (``extra="forbid"``), an ``"auto"`` left
   over is dropped so DeepSpeed's default applies, ZeRO-3 keys are accepted with or without their
   ``stage3_`` prefix but not both, deprecated keys are mapped to their replacements, and the field
   constraints (``gt=0``, ``ge=0``, ...) and cross-field validators are enforced. The field tables
   below are checked against DeepSpeed's own models in the tests.
3. The batch triple is completed and checked as ``DeepSpeedConfig._set_batch_related_parameters``
   and ``_batch_assertion`` do (``runtime/config.py``), with the world size from the context.

memfit is stricter than DeepSpeed in a few places, each a clear error instead of a late crash or a
silent coercion: values must have their JSON type (pydantic turns ``"3"`` into 3 and ``"yes"`` into
True; memfit does not), ``zero_optimization.stage`` cannot be ``"auto"`` (DeepSpeed alone reads 0,
accelerate fills 2), NVMe offload needs ``nvme_path``, ``gradient_clipping`` cannot be negative,
and optimizers whose memory memfit does not model are refused. Pure Python: no pydantic, no
deepspeed.

Modules: ``read`` (entry points, the batch triple, the whole config), ``auto`` (step 1),
``validate`` (step 2: the pydantic sections), ``sections`` (which top-level keys DeepSpeed reads,
refuses or ignores), ``optimizer`` (the optimizer section).
"""

from __future__ import annotations

from memfit.core.dsconfig.auto import (AUTO, AUTO_FLAGS, INT64_MAX, TRAINER_DEFAULTS, AutoContext, _trainer_warmup_steps,
                                      resolve_auto, resolve_auto_record, trainer_defaults)
from memfit.core.dsconfig.optimizer import (DEEPSPEED_OPTIMIZERS, TORCH_OPTIMIZERS, ZERO_TESTED_OPTIMIZERS,
                                            optimizer_states_per_param)
from memfit.core.dsconfig.read import (load_deepspeed_config, parse_deepspeed_config, read_deepspeed_json,
                                      resolve_batch_sizes)
from memfit.core.dsconfig.sections import KNOWN_TOP_LEVEL, LOOSE_SECTIONS, OPAQUE_SECTIONS, STRICT_SECTIONS
from memfit.core.dsconfig.validate import (BF16_FIELDS, FP16_FIELDS, OFFLOAD_OPTIMIZER_FIELDS, OFFLOAD_PARAM_FIELDS,
                                           REMOVED_TOP_LEVEL_KEYS, REMOVED_ZERO_KEYS, ZERO_DEPRECATED, ZERO_FIELDS, DsField,
                                           read_section)

__all__ = ["AUTO", "AUTO_FLAGS", "BF16_FIELDS", "DEEPSPEED_OPTIMIZERS", "FP16_FIELDS", "INT64_MAX",
           "OFFLOAD_OPTIMIZER_FIELDS", "OFFLOAD_PARAM_FIELDS", "REMOVED_TOP_LEVEL_KEYS", "REMOVED_ZERO_KEYS",
           "TORCH_OPTIMIZERS", "ZERO_DEPRECATED", "ZERO_FIELDS", "ZERO_TESTED_OPTIMIZERS", "AutoContext", "DsField",
           "_trainer_warmup_steps", "load_deepspeed_config", "optimizer_states_per_param", "parse_deepspeed_config",
           "read_section", "resolve_auto", "resolve_batch_sizes", "KNOWN_TOP_LEVEL", "LOOSE_SECTIONS",
           "OPAQUE_SECTIONS", "STRICT_SECTIONS", "TRAINER_DEFAULTS", "read_deepspeed_json", "resolve_auto_record",
           "trainer_defaults"]
