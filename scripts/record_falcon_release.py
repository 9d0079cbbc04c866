"""Record what the installed transformers' Falcon does, for the pure test of memfit's rules for that
release (tests/core/test_falcon_release_fixture.py), so CI, pinned to 5.24, still checks the 5.25 rules.

For the two small Falcon configs of tests/trace/test_family_activations.py (falcon-7b-style: multi-query;
falcon-40b-style: new decoder architecture, 2 key/value heads) it writes:

- ``peft``: peft's own counts (``get_peft_model`` on a meta-device build of the installed class) for
  prefix tuning (with and without the projection) and prompt tuning: trainable and total parameters
  and the ``token_dim`` ``_prepare_prompt_learning_config`` filled in;
- ``trace``: the activation bytes of one traced training step (``memfit.trace.step.trace_training_step``:
  the installed transformers' and peft's code on fake tensors, CUDA kernel choices) for every Falcon
  cell of tests/trace/test_activation_grid.py and of test_family_activations.py (both sequence lengths).

Run under the release to record (the file is named by it)::

    PYTHONPATH=src /tmp/v525/bin/python scripts/record_falcon_release.py   # tests/fixtures/releases/falcon-5.25.0.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

import transformers  # noqa: E402

from memfit.core.peft.spec import PeftSpec  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "releases" / f"falcon-{transformers.__version__}.json"
PEFT_SPECS = {
    "prefix": dict(method="prefix", num_virtual_tokens=7),
    "prefix-projection": dict(method="prefix", num_virtual_tokens=7, prefix_projection=True, encoder_hidden_size=20),
    "prompt": dict(method="prompt", num_virtual_tokens=6),
}


def peft_counts(config: dict) -> dict:
    import peft
    import torch
    from transformers import AutoModelForCausalLM, FalconConfig

    from memfit.exact.peft_build import build_peft_meta_model

    kw = {k: v for k, v in config.items() if k != "model_type"}
    out = {}
    for name, spec in PEFT_SPECS.items():
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(FalconConfig(**kw))
        real = build_peft_meta_model(model, PeftSpec(**spec))
        assert isinstance(real, peft.PeftModel)
        out[name] = {"spec": spec, "token_dim": real.peft_config["default"].token_dim,
                     "trainable": sum(p.numel() for p in real.parameters() if p.requires_grad),
                     "total": sum(p.numel() for p in real.parameters())}
    return out


def trace_cells() -> list[dict]:
    from memfit.trace.results import TraceOptions
    from memfit.trace.step import trace_training_step
    from tests.trace import test_activation_grid as grid
    from tests.trace.test_family_activations import CONFIGS, SEQS

    from memfit.core.families.attention import resolve

    cells = [dict(name=n, prec=p, method=m, **kw) for n, p, m, kw in grid._cells() if n.startswith("falcon")]
    cells += [dict(name=n, prec="bf16", method="full", seq=s, **kw) for s in SEQS for n, kw in (
        ("falcon-7b-style", {}), ("falcon-40b-style", {}), ("falcon-40b-style", {"gc": True}),
        ("falcon-7b-style", {"task": "token-classification", "b": 2}))]
    out = []
    for cell in cells:
        cid = grid._id((cell["name"], cell["prec"], cell["method"],
                        {k: v for k, v in cell.items() if k not in ("name", "prec", "method")}))
        if cid in grid.CANNOT_RUN:
            print(f"{cid}: cannot run ({grid.CANNOT_RUN[cid][:60]}...)", file=sys.stderr)
            continue
        config = CONFIGS[cell["name"]]
        method = cell["method"]
        spec = PeftSpec(method=method, **({"target_modules": grid.LORA_TARGETS[cell["name"]]} if method == "lora" else {}))
        dtype, autocast = grid.PRECISIONS[cell["prec"]]
        attention = cell.get("attention") or resolve("falcon", None)
        options = TraceOptions(seq_len=cell.get("seq", 48), micro_batch=cell.get("b", 1), dtype=dtype, autocast=autocast,
                               attention=attention, gradient_checkpointing=cell.get("gc", False), granularity_bytes=1,
                               task=cell.get("task"))
        try:
            traced = trace_training_step(config, spec, options).activation_bytes
        except Exception as exc:  # what the release cannot run is said, not recorded
            print(f"{cid}: {type(exc).__name__}: {str(exc)[:100]}", file=sys.stderr)
            continue
        row = {**cell, "seq": options.seq_len, "attention": attention, "target_modules": list(spec.target_modules or ()),
               "trace_bytes": traced}
        print(f"{cid} s={row['seq']}: {traced:,} B", file=sys.stderr)
        out.append(row)
    return out


def main() -> None:
    import peft
    import torch

    from tests.trace.test_family_activations import CONFIGS

    configs = {n: CONFIGS[n] for n in ("falcon-7b-style", "falcon-40b-style")}
    record = {
        "produced_by": f"PYTHONPATH=src {Path(sys.executable)} scripts/record_falcon_release.py",
        "transformers": transformers.__version__, "peft_version": peft.__version__, "torch": torch.__version__,
        "configs": configs,
        "peft": {n: peft_counts(c) for n, c in configs.items()},
        "trace": trace_cells(),
    }
    OUT.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}: {len(record['trace'])} traced cells", file=sys.stderr)


if __name__ == "__main__":
    main()
