"""The ``stack:`` section of a scenario file memfit writes (a recommendation judged under a stack
is written with it, so that planning the file judges it under the same one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memfit.core.scenario.inputs import ScenarioInputs


def stack_section(inputs: ScenarioInputs) -> dict[str, Any]:
    """The ``stack:`` mapping of the versions and stack files ``inputs`` gives beyond torch, CUDA and
    DeepSpeed (those are written as ``runtime:`` and ``deepspeed_version``)."""
    out: dict[str, Any] = {k: v for k, v in (("transformers", inputs.transformers_version),
                                             ("peft", inputs.peft_version),
                                             ("bitsandbytes", inputs.bitsandbytes_version),
                                             ("accelerate", inputs.accelerate_version),
                                             ("trl", inputs.trl_version)) if v}
    if inputs.stack_files:
        out["files"] = [str(Path(f).resolve()) for f in inputs.stack_files]
    return out
