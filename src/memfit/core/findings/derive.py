"""The findings of a plan, from the recipes of its framework (one module per framework beside this one).

Every finding is computed from the ledger (never recomputed from formulas of its own), so the
numbers it quotes are the numbers the tables show. Each framework's module is imported when a plan of
that framework needs it (a DeepSpeed plan never imports the PyTorch findings, and the other way round).
"""

from __future__ import annotations

from memfit.core.findings.activations import activation_findings
from memfit.core.findings.inputs import input_file_findings, stack_findings
from memfit.core.ledger_types import Finding, PhaseLedger, Verdict
from memfit.core.scenario.types import Scenario


def derive_findings(sc: Scenario, phases: tuple[PhaseLedger, ...], verdict: Verdict) -> tuple[Finding, ...]:
    """Plain-words findings: why the run fails or nearly fails, and what the numbers mean."""
    if sc.framework == "deepspeed":
        from memfit.core.findings.deepspeed import deepspeed_findings

        own = deepspeed_findings(sc, phases, verdict)
    else:
        from memfit.core.findings.pytorch import pytorch_findings

        own = pytorch_findings(sc, phases, verdict)
    return (*own, *activation_findings(sc), *input_file_findings(sc), *stack_findings(sc))
