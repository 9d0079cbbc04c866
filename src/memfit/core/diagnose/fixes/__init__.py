"""The usual fixes for a failure, from the run's own framework only: ``deepspeed`` (ZeRO stage
aware: zero.Init only under ZeRO-3) or ``pytorch`` (a plain loop or the Trainer, DDP, FSDP1/2,
bitsandbytes QLoRA). What the run is comes from the scenario when one is given, else from the log
(its frames and library lines: ``facts_from_log``). This is the one place that branches on it."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from memfit.core.lean_dataclass import dataclass
from memfit.core.diagnose.results import LogEvent

if TYPE_CHECKING:
    from memfit.core.scenario.types import Scenario


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFacts:
    """What the failed run was, as far as the fixes need it."""

    framework: str | None
    """``deepspeed``, ``torch``, ``ddp``, ``fsdp``, ``fsdp2``; None: the log does not say."""
    zero_stage: int | None = None
    quantized: bool = False
    """A bitsandbytes 4/8-bit base (QLoRA)."""
    peft: bool | None = None
    checkpointing: bool | None = None
    offload: bool = False
    """Optimizer or parameters offloaded to the host (DeepSpeed offload, FSDP CPU offload)."""
    source: str = "log"
    """``scenario`` or ``log``."""


def facts_from_scenario(sc: Scenario) -> RunFacts:
    z = sc.deepspeed.zero
    ds = sc.framework == "deepspeed"
    return RunFacts(framework=sc.framework, zero_stage=z.stage if ds else None, quantized=sc.quant.enabled,
                    peft=sc.peft.method not in ("full", "freeze"), checkpointing=sc.train.gradient_checkpointing,
                    offload=(z.offload_optimizer.device != "none" or z.offload_param.device != "none") if ds
                    else bool(sc.framework.startswith("fsdp") and sc.fsdp.cpu_offload), source="scenario")


_STAGE = re.compile(r"ZeRO [Ss]tage (\d)|\"stage\": (\d)|zero_stage[=:] ?(\d)")


def facts_from_log(text: str, ev: LogEvent | None, zero3: bool) -> RunFacts:
    """The framework as the log shows it: DeepSpeed's frames or lines, FSDP's or DDP's frames,
    bitsandbytes' frames; None when nothing says."""
    paths = " ".join(f.path for f in (ev.frames if ev else ()))
    low = paths.replace("\\", "/")
    quant = "bitsandbytes/" in low or "Linear4bit" in text or "load_in_4bit" in text
    peft = True if "peft/" in low else None
    if "deepspeed/" in low or "DeepSpeed info: version=" in text or "deepspeed.initialize" in text:
        m = _STAGE.search(text)
        stage = 3 if zero3 else int(next(g for g in m.groups() if g)) if m else None
        if stage is None and "stage_1_and_2.py" in low + text:
            stage = 2
        return RunFacts(framework="deepspeed", zero_stage=stage, quantized=quant, peft=peft)
    if "torch/distributed/fsdp/_fully_shard" in low or "fully_shard" in text:
        return RunFacts(framework="fsdp2", quantized=quant, peft=peft)
    if "torch/distributed/fsdp/" in low or "FullyShardedDataParallel" in text:
        return RunFacts(framework="fsdp", quantized=quant, peft=peft)
    if "torch/nn/parallel/distributed.py" in low or "DistributedDataParallel" in text:
        return RunFacts(framework="ddp", quantized=quant, peft=peft)
    return RunFacts(framework="torch" if quant else None, quantized=quant, peft=peft)


def phase_fixes(ev: LogEvent, phase: str | None, facts: RunFacts, *, host: bool) -> list[str]:
    """The fixes for a memory failure in ``phase`` on the GPU (``host`` False) or the host, from the
    run's framework's own module; none when the log does not say which framework ran."""
    if facts.framework == "deepspeed":
        from memfit.core.diagnose.fixes.deepspeed import fixes
    elif facts.framework is not None:
        from memfit.core.diagnose.fixes.pytorch import fixes
    else:
        return ["memfit cannot tell the framework from this log: give the scenario (`memfit diagnose SCENARIO "
                "--log ...`) for fixes that fit the run"]
    base = phase.split(".", 1)[1] if phase and phase.startswith(("step2.", "accum.")) else phase
    return fixes(ev, base, facts, host=host, steady=bool(phase and phase.startswith("step2.")))
