"""The stack of a scenario from what the user gave: versions as flags or under ``stack:`` in the
scenario file (``deepspeed_version`` and ``runtime.torch_version``/``cuda_version``/
``transformers_version`` are the same inputs under their older names), versions read from stack
files (``--stack FILE``, ``stack.files``), and for every library left unsaid its named default, said
as an assumption.

The stack files are an input layer like any other (``memfit.core.inputs.precedence``: ``stack``,
just above the defaults), merged by ``memfit.core.inputs.merge`` before this runs: a flag or the
scenario overriding a file is a note, two files that disagree one error line naming both. A torch
build whose CUDA (``+cu113``) contradicts the CUDA given is one error line too.
"""

from __future__ import annotations

from typing import Any

from memfit.core.stack.releases import ORDER, cuda_from_local, library, release_line, split_local
from memfit.core.stack.types import Stack, StackEntry
from memfit.errors import MemfitError

FIELDS = {"torch": "torch_version", "cuda": "cuda_version", "deepspeed": "ds_version",
          "transformers": "transformers_version", "peft": "peft_version", "bitsandbytes": "bitsandbytes_version",
          "accelerate": "accelerate_version", "trl": "trl_version"}
"""``ScenarioInputs`` field of each library's version."""

LABELS = {"torch": "--torch-version (stack.torch, runtime.torch_version)",
          "cuda": "--cuda-version (stack.cuda, runtime.cuda_version)",
          "deepspeed": "--deepspeed-version (stack.deepspeed, deepspeed_version)",
          **{lib: f"--{lib}-version (stack.{lib})" for lib in ("transformers", "peft", "bitsandbytes", "accelerate", "trl")}}


def _uses(library_name: str, framework: str, inputs: Any) -> str | None:
    """Why a library left unsaid does not matter for this scenario (None: it does)."""
    if library_name == "deepspeed" and framework != "deepspeed":
        return f"not used by framework {framework}"
    if library_name == "peft" and (inputs.peft_method or "full") in ("full", "freeze"):
        return "no PEFT method"
    if library_name == "bitsandbytes":
        quantized = (inputs.quantization or {}).get("method", "none") not in (None, "none")
        bnb_optim = any(k in str(inputs.optim or "") for k in ("bnb", "8bit", "paged", "lion"))
        if not (quantized or bnb_optim):
            return "no bitsandbytes quantization or optimizer"
    return None


def resolve_stack(inputs: Any, *, framework: str) -> Stack:
    """``inputs``: a ``ScenarioInputs`` whose stack files the precedence layer has merged
    (``memfit.core.inputs.merge``: a version read from a file fills its field, the origin saying
    where); ``framework``: the resolved one (which libraries matter)."""
    origins = getattr(inputs, "origins", None) or {}
    merged: dict[str, tuple[str, str]] = {}
    for lib, fld in FIELDS.items():
        value = getattr(inputs, fld, None)
        if value is not None:
            merged[lib] = (str(value), origins.get(fld) or LABELS[lib])
    torch_text = merged.get("torch")
    if torch_text is not None:
        local_cuda = cuda_from_local(split_local(torch_text[0])[1])
        if local_cuda is not None:
            if "cuda" in merged and _line("cuda", merged["cuda"][0], merged["cuda"][1]) != local_cuda:
                raise MemfitError(f"{merged['cuda'][1]}: CUDA {merged['cuda'][0]} contradicts the torch build "
                                  f"{torch_text[0]} ({torch_text[1]}), which is built with CUDA {local_cuda}")
            merged.setdefault("cuda", (local_cuda, f"{torch_text[1]}: the torch build's +cu suffix"))
    entries = []
    for lib in ORDER:
        if lib in merged:
            text, where = merged[lib]
            line = release_line(lib, text, where=where)
            entries.append(StackEntry(library=lib, version=text, line=line, source=_short(where)))
            continue
        entries.append(_default(lib, entries, framework, inputs))
    return Stack(entries=tuple(entries))


def _line(lib: str, text: str, where: str) -> str | None:
    """The release line of a version (two versions agree when their lines do: 0.5 and 0.5.8)."""
    return release_line(lib, text, where=where)


def _short(where: str) -> str:
    from memfit.core.inputs.stack_reading import read_from

    read = read_from(where)
    return f"read: {read}" if read is not None else "given"


def _default(lib: str, entries: list[StackEntry], framework: str, inputs: Any) -> StackEntry:
    if lib == "cuda":
        from memfit.core.alloc.versions import resolve_torch_version

        torch_line = next(e.line for e in entries if e.library == "torch")
        v = resolve_torch_version(torch_line)
        return StackEntry(library=lib, version=None, line=v.default_cuda, assumed=True,
                          source=f"the CUDA of torch {torch_line}'s usual wheel for this GPU generation")
    spec = library(lib)
    why = _uses(lib, framework, inputs)
    reason = f"memfit's default, the release whose source was read ({spec.label} {spec.default_release})"
    if why is not None:
        reason += f"; {why}"
    return StackEntry(library=lib, version=None, line=spec.default, assumed=True, source=reason)


def stack_from_fields(sc: Any) -> Stack:
    """The stack of a scenario built without one (``Scenario(..., ds_version=, runtime=)``): DeepSpeed
    and torch/CUDA from those fields, the rest memfit's defaults, each said as such."""
    from memfit.core.stack.releases import library as lib_of

    entries = [StackEntry(library="torch", version=None, line=sc.runtime.torch_version, source="the scenario's runtime"),
               StackEntry(library="cuda", version=None, line=_cuda_line(sc), source="the scenario's runtime",
                          assumed=sc.runtime.cuda_version is None),
               StackEntry(library="deepspeed", version=None, line=sc.ds_version,
                          source="the scenario's allocation model")]
    for lib in ORDER[3:]:
        spec = lib_of(lib)
        entries.append(StackEntry(library=lib, version=None, line=spec.default, assumed=True,
                                  source=f"memfit's default, the release whose source was read ({spec.label} "
                                         f"{spec.default_release})"))
    return Stack(entries=tuple(entries))


def _cuda_line(sc: Any) -> str:
    from memfit.core.alloc.versions import resolve_torch_version

    c = sc.runtime.cuda_version or resolve_torch_version(sc.runtime.torch_version).default_cuda
    return ".".join(str(c).split(".")[:2])


def trainer_optim_default(inputs: Any) -> tuple[str, str]:
    """The Trainer's default ``optim`` for this stack's transformers and torch (a TrainingArguments
    file that leaves it out): ``(optim, why)``; see ``stack/transformers.py``."""
    from memfit.core.stack.transformers import trainer_default_optim

    st = resolve_stack(inputs, framework=getattr(inputs, "framework", None) or "torch")
    return trainer_default_optim(st.transformers, st.torch)


def trainer_fsdp_version(inputs: Any) -> int:
    """The FSDP version the Trainer runs when ``fsdp_config`` names none: 2 from transformers 5.0
    (``training_args.py``: ``int(self.fsdp_config.get("version", 2))``), 1 before (4.x has no
    version key: accelerate's FSDP1 plugin)."""
    from memfit.core.stack.releases import at_least

    line = resolve_stack(inputs, framework=getattr(inputs, "framework", None) or "fsdp").transformers
    return 2 if line is None or at_least(line, "5.0") else 1


def trainer_cpu_ram_loading(inputs: Any) -> tuple[bool, str]:
    """Whether this stack's TrainingArguments reads ``fsdp_config.cpu_ram_efficient_loading``, and why
    (``stack/transformers.py:trainer_reads_cpu_ram_efficient_loading``)."""
    from memfit.core.stack.transformers import trainer_reads_cpu_ram_efficient_loading

    line = resolve_stack(inputs, framework=getattr(inputs, "framework", None) or "fsdp").transformers
    return trainer_reads_cpu_ram_efficient_loading(line)


def bnb_quant_storage_read(inputs: Any) -> tuple[bool, str]:
    """Whether this stack's BitsAndBytesConfig reads ``bnb_4bit_quant_storage``, and why not
    (``stack/transformers.py:bnb_reads_quant_storage``)."""
    from memfit.core.stack.transformers import bnb_reads_quant_storage

    return bnb_reads_quant_storage(resolve_stack(inputs, framework=getattr(inputs, "framework", None) or "torch")
                                   .transformers)


def trainer_fsdp_wrap(inputs: Any) -> tuple[str, str] | None:
    """The Trainer's auto-wrap policy for a PEFT LoRA model under FSDP: peft's
    ``fsdp_auto_wrap_policy`` from transformers 4.39 (``trainer.py:_fsdp_qlora_plugin_updates``; 5.x
    ``distributed/fsdp.py:update_fsdp_plugin_peft``), whatever the FSDP config said; None before 4.39
    or without LoRA."""
    from memfit.core.stack.releases import at_least

    method = str(inputs.peft_method or "full")
    if method in ("full", "freeze", "prefix", "prompt"):
        return None
    line = resolve_stack(inputs, framework="fsdp").transformers
    if line is None or not at_least(line, "4.39"):
        return None
    return "peft", (f"FSDP auto-wrap policy peft (each LoRA Linear a unit of its own): the Trainer of transformers {line} "
                    "sets peft's fsdp_auto_wrap_policy for a PEFT model (since 4.39)")
