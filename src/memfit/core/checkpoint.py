"""The checkpoint's shards: what ``from_pretrained`` holds in host memory while it loads.

A sharded checkpoint (``model.safetensors.index.json`` + ``model-0000k-of-0000n.safetensors``) is
loaded one shard at a time: transformers reads a shard's state dict, copies it into the model (or,
under ZeRO-3, into each module's gathered params), drops it and reads the next
(``modeling_utils.py``: the loop over ``checkpoint_files``). So what a process holds besides the
model is the largest shard, not the whole file.

Where the shard sizes come from (``CheckpointLayout.source`` says which):
- a ``model.safetensors.index.json`` the user gives (``--checkpoint-index``): its ``weight_map``
  assigns each tensor to a file; a tensor's bytes are its element count times the saved dtype's size;
- else ``max_shard_size`` (``--max-shard-size``), or the default of the transformers version that
  saved the model (config.json ``transformers_version``): none before 4.18 (one file), "10GB" from
  4.18 (PR #16343), "5GB" from 4.35 (PR #26942), "50GB" from 5.0 (PR #42734); the tensors split in
  state-dict order as huggingface_hub ``split_torch_state_dict_into_shards`` does (a tensor that
  would overflow the current shard starts a new one; a tensor larger than the limit is a shard of
  its own). Sizes like "5GB" are decimal (10^9), as transformers parses them.
The saved dtype is config.json's ``torch_dtype`` (``dtype`` in transformers 5), fp32 when absent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from memfit.core.lean_dataclass import dataclass
from memfit.errors import MemfitError

SAVED_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "fp32": 4, "fp16": 2, "bf16": 2}

DEFAULT_MAX_SHARD = ((5, 0, 50 * 10**9), (4, 35, 5 * 10**9), (4, 18, 10 * 10**9))
"""(major, minor, bytes): ``save_pretrained``'s default ``max_shard_size`` from that version on."""

PEFT_PREFIXES = ("base_model.model.", "base_model.")
"""How peft prefixes the base model's parameter names (LoRA: ``base_model.model.``; prompt
learning: ``base_model.``); ``.base_layer`` is LoRA's wrapped module."""


@dataclass(frozen=True, slots=True)
class CheckpointLayout:
    """The checkpoint's files, in load order, each as (tensor key, bytes) in the saved dtype."""

    shards: tuple[tuple[tuple[str, int], ...], ...]
    source: str
    """Where the split comes from, in words (the index file, or the max_shard_size used and why)."""
    saved_dtype: str

    @property
    def shard_bytes(self) -> tuple[int, ...]:
        return tuple(sum(b for _, b in s) for s in self.shards)

    @property
    def largest_shard_bytes(self) -> int:
        return max(self.shard_bytes, default=0)

    def shard_of(self) -> dict[str, int]:
        return {k: i for i, s in enumerate(self.shards) for k, _ in s}


def checkpoint_key(name: str) -> str:
    """The checkpoint key of a (PEFT-wrapped) model's parameter name."""
    for prefix in PEFT_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    return name.replace(".base_layer.", ".")


def saved_dtype(config: Mapping[str, Any]) -> str:
    value = config.get("torch_dtype", config.get("dtype")) or "float32"
    value = str(value).replace("torch.", "")
    if value not in SAVED_DTYPE_BYTES:
        raise MemfitError(f"config.json: unknown torch_dtype {value!r} (expected float32, float16 or bfloat16)")
    return value


def default_max_shard_size(transformers_version: str | None) -> int | None:
    """``save_pretrained``'s default ``max_shard_size`` in that transformers version (None: the
    version did not shard)."""
    if not transformers_version:
        return DEFAULT_MAX_SHARD[1][2]
    parts = []
    for piece in str(transformers_version).split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    major, minor = (parts + [0, 0])[:2]
    for ma, mi, size in DEFAULT_MAX_SHARD:
        if (major, minor) >= (ma, mi):
            return size
    return None


def split_shards(tensors: Sequence[tuple[str, int]], max_shard_size: int) -> list[list[tuple[str, int]]]:
    """huggingface_hub ``serialization/_base.py:split_state_dict_into_shards_factory``."""
    shards: list[list[tuple[str, int]]] = []
    current: list[tuple[str, int]] = []
    size = 0
    for key, nbytes in tensors:
        if nbytes > max_shard_size:
            shards.append([(key, nbytes)])
            continue
        if size + nbytes > max_shard_size:
            shards.append(current)
            current, size = [], 0
        current.append((key, nbytes))
        size += nbytes
    if current:
        shards.append(current)
    return shards


def layout_from_config(tensors: Sequence[tuple[str, int]], config: Mapping[str, Any], *,
                       max_shard_size: int | None = None) -> CheckpointLayout:
    """The shards ``save_pretrained`` would have written (``tensors``: key and element count, in
    state-dict order)."""
    dtype = saved_dtype(config)
    eb = SAVED_DTYPE_BYTES[dtype]
    sized = [(k, n * eb) for k, n in tensors]
    version = config.get("transformers_version")
    if max_shard_size is not None:
        limit, why = max_shard_size, f"max_shard_size {max_shard_size:,} B (given)"
    else:
        limit = default_max_shard_size(version)
        saved_by = f"transformers {version}" if version else "an unknown transformers version (assumed 4.35-4.x)"
        why = (f"one file: {saved_by} did not shard" if limit is None else
               f"max_shard_size {limit / 1e9:g} GB, the default of {saved_by} that saved the model")
    shards = [sized] if limit is None else split_shards(sized, limit)
    return CheckpointLayout(shards=tuple(tuple(s) for s in shards if s), source=why, saved_dtype=dtype)


def layout_from_index(path: str | Path, tensors: Sequence[tuple[str, int]], config: Mapping[str, Any]) -> CheckpointLayout:
    """The shards a ``model.safetensors.index.json`` lists (tensors not in the model are ignored;
    model tensors it does not list are not loaded from the checkpoint)."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MemfitError(f"checkpoint index not found: {p}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MemfitError(f"{p}: not a JSON checkpoint index ({e})") from None
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise MemfitError(f"{p}: a checkpoint index needs a 'weight_map' of tensor name -> file name")
    dtype = saved_dtype(config)
    eb = SAVED_DTYPE_BYTES[dtype]
    numel = dict(tensors)
    files: dict[str, list[tuple[str, int]]] = {}
    for key, file in weight_map.items():
        if key in numel:
            files.setdefault(file, []).append((key, numel[key] * eb))
    if not files:
        raise MemfitError(f"{p}: none of its tensors is a parameter of this model")
    shards = tuple(tuple(files[f]) for f in sorted(files))  # transformers loads sorted(set(weight_map.values()))
    return CheckpointLayout(shards=shards, source=f"{len(shards)} shard(s) listed by {p.name}", saved_dtype=dtype)
