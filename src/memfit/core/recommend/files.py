"""Writing recommendations to a directory: per rank, the patched DeepSpeed JSON, the script diff and
a scenario file that ``memfit plan`` reads back. Nothing that exists is ever overwritten: if any
target exists (a dangling symbolic link included), nothing is written and the error names it; each
file is created by memfit's one writer (``memfit.core.writing``), never through a link.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from memfit.core.recommend.results import Recommendation, RecommendResult
from memfit.core.recommend.deepspeed.space import Candidate
from memfit.core.scenario.inputs import ScenarioInputs
from memfit.core.writing import write_file
from memfit.errors import MemfitError

EXISTS_HINT = "memfit never overwrites a file you have (choose another --out)"


def slug(c: Candidate) -> str:
    """A short file-name tag of the configuration, e.g. ``zero3-optcpu-paramcpu-zinit-ckpt-mb2``."""
    if not hasattr(c, "stage"):  # a non-DeepSpeed candidate (memfit.core.recommend.pytorch.search)
        parts = [c.framework] + ([c.sharding_strategy.lower()] if c.sharding_strategy else []) + \
            (["offload"] if c.cpu_offload else []) + [c.precision, c.optim] + \
            (["4bit"] if c.quantization == "4bit" else []) + (["ckpt"] if c.gradient_checkpointing else []) + \
            [f"mb{c.micro_batch}"]
        return "-".join(parts)
    parts = [f"zero{c.stage}"]
    if c.offload_optimizer != "none":
        parts.append(f"opt{c.offload_optimizer}")
    if c.offload_param != "none":
        parts.append(f"param{c.offload_param}")
    if c.zero_init:
        parts.append("zinit")
    if c.gradient_checkpointing:
        parts.append("ckpt")
    parts.append(f"mb{c.micro_batch}")
    return "-".join(parts)


def scenario_document(inputs: ScenarioInputs, *, deepspeed_file: str, hardware: dict[str, Any]) -> dict[str, Any]:
    """The scenario YAML mapping (``memfit.core.scenario.inputs`` keys) of a recommendation's inputs,
    with the DeepSpeed config given by file name (relative to the YAML)."""
    model = inputs.model
    if model and Path(model).exists():
        model = str(Path(model).resolve())
    peft: Any = inputs.peft_method or "full"
    if peft.endswith(".json") and Path(peft).exists():
        peft = {"adapter_config": str(Path(peft).resolve())}
    elif inputs.peft_options:
        peft = {"method": peft, **{k: list(v) if isinstance(v, tuple) else v for k, v in inputs.peft_options.items()}}
    doc: dict[str, Any] = {"name": inputs.name, "model": model, "peft": peft, "deepspeed": deepspeed_file,
                           "deepspeed_version": inputs.ds_version or "0.19", "hardware": hardware,
                           "load": {"dtype": inputs.load_dtype, "zero_init": bool(inputs.zero_init),
                                    "low_cpu_mem_usage": bool(inputs.low_cpu_mem_usage)},
                           "train": {k: v for k, v in (("seq_len", inputs.seq_len), ("micro_batch", inputs.micro_batch),
                                                       ("gradient_checkpointing", inputs.gradient_checkpointing),
                                                       ("model_parameters", inputs.model_parameters),
                                                       ("attention", inputs.attention)) if v is not None}}
    if inputs.trust_remote_code:
        doc["trust_remote_code"] = True
    runtime = {k: v for k, v in (("torch_version", inputs.torch_version), ("alloc_conf", inputs.alloc_conf),
                                 ("cuda_version", inputs.cuda_version), ("pin_memory_backend", inputs.pin_memory_backend),
                                 ("bitsandbytes_version", inputs.bitsandbytes_version))
               if v}
    if runtime:  # the allocator rules the recommendation was judged under
        doc["runtime"] = runtime
    return doc


def _hardware(result: RecommendResult, inputs: ScenarioInputs) -> dict[str, Any]:
    hw = result.hardware
    out: dict[str, Any] = {"gpus": inputs.gpus or f"{hw.gpus_per_node}x{hw.gpu.name}", "nodes": hw.nodes,
                           "cpu_ram": inputs.cpu_ram or str(hw.cpu_ram_bytes)}
    if inputs.nvme:
        out["nvme"] = inputs.nvme
    return out


def planned_files(result: RecommendResult, out_dir: Path) -> list[tuple[Recommendation, Path, Path, Path | None]]:
    """(recommendation, JSON path, scenario path, diff path or None) for every recommendation."""
    rows = []
    for rec in result.recommendations:
        stem = f"rank{rec.rank}-{slug(rec.candidate)}"
        rows.append((rec, out_dir / f"{stem}.json", out_dir / f"{stem}.yaml",
                     out_dir / f"{stem}.diff" if rec.script_diff else None))
    return rows


def write_recommendations(result: RecommendResult, out_dir: str | Path) -> RecommendResult:
    """Write every recommendation's files into ``out_dir`` (created if needed); returns the result
    with each recommendation's ``files`` filled. Refuses, writing nothing, if any file exists."""
    import yaml

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise MemfitError(f"--out {out} exists and is not a directory")
    rows = planned_files(result, out)
    for rec, *paths in rows:
        for p in paths:
            if p is not None and os.path.lexists(p) and (rec.deepspeed_json or p.suffix != ".json"):
                raise MemfitError(f"{p} exists; {EXISTS_HINT}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MemfitError(f"--out: cannot create directory {out}: {e.strerror or type(e).__name__}") from None
    recs = []
    for rec, json_path, yaml_path, diff_path in rows:
        if not rec.deepspeed_json:  # outside DeepSpeed: the scenario file says everything
            from memfit.core.recommend.pytorch.search import torch_scenario_document

            doc = torch_scenario_document(rec, hardware=_hardware(result, rec.scenario_inputs))
            written = [_write_new(yaml_path, "# memfit recommend: memfit plan this file to see its ledger\n"
                                  + yaml.safe_dump(doc, sort_keys=False))]
            recs.append(replace(rec, files=tuple(written)))
            continue
        doc = scenario_document(replace(rec.scenario_inputs, name=f"{rec.scenario_inputs.name} (recommendation {rec.rank})"),
                                deepspeed_file=json_path.name, hardware=_hardware(result, rec.scenario_inputs))
        written = [_write_new(json_path, json.dumps(_plain_numbers(rec.deepspeed_json), indent=4) + "\n"),
                   _write_new(yaml_path, "# memfit recommend: memfit plan this file to see its ledger\n"
                              + yaml.safe_dump(doc, sort_keys=False))]
        if diff_path is not None:
            written.append(_write_new(diff_path, rec.script_diff))
        recs.append(replace(rec, files=tuple(written)))
    return replace(result, recommendations=tuple(recs))


def _plain_numbers(v: Any) -> Any:
    """Whole-number floats of 10,000 or more (``5e8`` read from JSON) as ints, so they print as
    ``500000000`` rather than ``500000000.0``; DeepSpeed reads both the same."""
    if isinstance(v, dict):
        return {k: _plain_numbers(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain_numbers(x) for x in v]
    if isinstance(v, float) and v.is_integer() and abs(v) >= 10_000:
        return int(v)
    return v


def _write_new(path: Path, text: str) -> str:
    return str(write_file(path, text, what="--out", exists_hint=EXISTS_HINT))
