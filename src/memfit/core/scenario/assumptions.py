"""Every value a plan uses that no input gave, said as an assumption: the hardware, the lengths, the
software stack and the libraries' defaults, each with where it comes from and how to change it.
Rendered as one short block (``render/assumptions.py``) and listed in the JSON's ``scenario``."""

from __future__ import annotations

from memfit.core.scenario.inputs import ScenarioInputs
from memfit.core.scenario.types import Assumption, Scenario

TRANSFORMERS_DEFAULT = "5.24"
"""The transformers release whose Trainer and ``from_pretrained`` memfit models unless told."""

_FILE_SETTING = {"micro_batch": ("lengths", "micro batch"), "grad_accum": ("defaults", "gradient accumulation"),
                 "gradient_checkpointing": ("defaults", "gradient checkpointing"), "optim": ("defaults", "optimizer"),
                 "precision": ("defaults", "precision"), "seq_len": ("lengths", "sequence length"),
                 "max_seq_length": ("lengths", "truncation length"), "gpus": ("hardware", "GPUs"),
                 "nodes": ("hardware", "nodes"), "framework": ("defaults", "framework")}


def assumptions(inputs: ScenarioInputs, sc: Scenario, *, precision_why: str = "",
                attention_why: str = "") -> tuple[Assumption, ...]:
    """The assumptions of ``sc``, built from ``inputs`` (after the input files are merged)."""
    from memfit.core.alloc.versions import resolve_torch_version
    from memfit.core.hardware import DEFAULT_CPU_RAM

    out: list[Assumption] = []

    def add(kind: str, what: str, value: str, why: str) -> None:
        out.append(Assumption(kind=kind, what=what, value=value, why=why))

    hw = sc.hardware
    from_files = {name: (value, why) for name, value, why in inputs.assumed}
    if inputs.gpus is None:
        add("hardware", "GPUs", f"{hw.gpus_per_node} x {hw.gpu.name} ({hw.gpu.total_bytes / 2**30:.2f} GiB)",
            "memfit's default; --gpus")
    if inputs.cpu_ram is None:
        add("hardware", "host RAM", f"{DEFAULT_CPU_RAM} per node", "memfit's default; --cpu-ram")
    if inputs.lengths is None:
        if inputs.seq_len is None and inputs.max_seq_length is None:
            add("lengths", "sequence length", f"{sc.train.seq_len:,} tokens", "memfit's default; --seq-len")
        elif inputs.seq_len is None:
            add("lengths", "sequence length", f"{sc.train.seq_len:,} tokens",
                "every sample at --max-seq-length, the truncation (no --lengths)")
    if sc.train.target_len is None and sc.model.arch.num_encoder_layers:
        add("lengths", "decoder length", f"{sc.train.seq_len:,} tokens", "the encoder's; --target-len")
    has_config = bool(inputs.deepspeed or inputs.deepspeed_inline is not None)
    if inputs.micro_batch is None and "micro_batch" not in from_files and (not has_config or any(
            r.startswith("train_micro_batch_size_per_gpu") and "memfit's default" in r
            for r in sc.deepspeed.auto_resolved)):
        add("lengths", "micro batch", f"{sc.train.micro_batch}", "memfit's default; --micro-batch")
    stack = sc.versions  # given, read from a stack file (--stack) or assumed, per library
    if stack.entry("torch").assumed:
        add("stack", "torch", sc.runtime.torch_version, "--torch-version or --stack FILE")
    if sc.framework == "deepspeed" and stack.entry("deepspeed").assumed:
        add("stack", "DeepSpeed", f"{stack.deepspeed}.x", "--deepspeed-version or --stack FILE")
    if stack.entry("transformers").assumed:
        add("stack", "transformers", stack.transformers or TRANSFORMERS_DEFAULT,
            "the Trainer's and from_pretrained's; --transformers-version or --stack FILE")
    if stack.entry("cuda").assumed:
        add("stack", "CUDA", resolve_torch_version(sc.runtime.torch_version).default_cuda,
            f"torch {sc.runtime.torch_version}'s usual; --cuda-version")
    if inputs.load_dtype is None:
        add("defaults", "load dtype", sc.load.dtype, _load_dtype_why(sc))
    if inputs.precision is None and "precision" not in from_files:
        if sc.framework == "deepspeed":
            if any(k.startswith(("fp16.enabled", "bf16.enabled")) for k in sc.deepspeed.auto_resolved) or \
                    not has_config:
                add("defaults", "precision", sc.deepspeed.precision, precision_why or "memfit's default")
        else:
            add("defaults", "precision", sc.torch.precision, "no autocast; --precision")
    if sc.framework != "deepspeed" and inputs.optim is None and "optim" not in from_files:
        add("defaults", "optimizer", sc.torch.optim, "--optim")
    if inputs.gradient_checkpointing is None and "gradient_checkpointing" not in from_files:
        add("defaults", "gradient checkpointing", "on" if sc.train.gradient_checkpointing else "off",
            "--gradient-checkpointing")
    if inputs.attention is None:
        add("defaults", "attention", sc.train.attention, (attention_why or "transformers' choice") + "; --attention")
    if inputs.task is None:
        add("defaults", "task", sc.model.arch.task, "the config's architectures; --task")
    for name, (value, why) in from_files.items():
        kind, what = _FILE_SETTING.get(name, ("defaults", name.replace("_", " ")))
        add(kind, what, value, why)
    return tuple(out)


def _load_dtype_why(sc) -> str:  # noqa: ANN001 (Scenario)
    """Why the load dtype, when no input gave it: the stack's rule (``stack.transformers.load_dtype_default``,
    carried as ``LoadSettings.dtype_why``)."""
    return f"{sc.load.dtype_why}; --load-dtype"

