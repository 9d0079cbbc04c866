"""Findings about the inputs themselves: what memfit resolved or DeepSpeed would ignore.

The standard is that nothing is guessed silently: every ``"auto"`` memfit fills is listed with
its value and reason, every key DeepSpeed would ignore is a warning, and the remarks made while
reading the config (deprecated keys, a default config) are info findings.
"""

from __future__ import annotations

from memfit.core.ledger_types import Finding
from memfit.core.scenario.types import Scenario


def input_findings(sc: Scenario) -> list[Finding]:
    ds = sc.deepspeed
    out = [Finding(id="deepspeed-config-ignored", severity="warning", message=w) for w in ds.warnings]
    if ds.auto_resolved:
        out.append(Finding(id="deepspeed-auto-resolved", severity="info", message=(
            f'"auto" in the DeepSpeed config, resolved as transformers\' Trainer does: {"; ".join(ds.auto_resolved)}.')))
    out.extend(Finding(id="deepspeed-config-note", severity="info", message=n) for n in ds.notes)
    return out


def input_file_findings(sc: Scenario) -> list[Finding]:
    """What a library would ignore in the user's TrainingArguments, accelerate or BitsAndBytesConfig file, or
    memfit reads but does not model (any framework): one warning each."""
    return [Finding(id="input-file-ignored", severity="warning", message=w) for w in sc.input_warnings]
