"""The configuration files people already have, read into memfit's scenario inputs.

- ``training_args``: a Hugging Face ``TrainingArguments`` or TRL ``SFTConfig`` as JSON or YAML;
- ``bnb_config``: a ``BitsAndBytesConfig`` as JSON (what ``to_json_file`` writes, or the
  ``quantization_config`` of a model's config.json);
- ``accelerate_config``: an accelerate config YAML (``accelerate config`` writes one).

``merge_input_files(inputs)`` reads the files named in ``ScenarioInputs`` and fills the scenario's
unset settings from them; a setting two sources give differently is one error line naming both
(``Conflict``). Keys that change no memory are ignored, and the plan's notes say which.
Files are parsed safely (``yaml.safe_load``, no tags; ``json.loads``).
"""

from __future__ import annotations

from memfit.core.inputs.merge import merge_input_files

__all__ = ["merge_input_files"]
