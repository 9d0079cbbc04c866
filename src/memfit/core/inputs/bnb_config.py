"""A ``BitsAndBytesConfig`` as JSON (``BitsAndBytesConfig.to_json_file``, or a model config.json's
``quantization_config``), with transformers 5.24's defaults (``utils/quantization_config.py``):
``bnb_4bit_quant_type`` fp4, ``bnb_4bit_use_double_quant`` false, ``bnb_4bit_compute_dtype``
float32, ``bnb_4bit_quant_storage`` uint8, ``llm_int8_skip_modules`` none (transformers' default
skips)."""

from __future__ import annotations

from memfit.core.inputs.common import Sourced, as_bool, dtype_name, read_mapping
from memfit.errors import MemfitError


def read_bnb_config(path: str) -> Sourced:
    raw = read_mapping(path, "BitsAndBytesConfig file")
    if isinstance(raw.get("quantization_config"), dict):  # a model's config.json
        raw = raw["quantization_config"]
    four = as_bool(raw.get("load_in_4bit", raw.get("_load_in_4bit", False)), f"{path}: load_in_4bit")
    eight = as_bool(raw.get("load_in_8bit", raw.get("_load_in_8bit", False)), f"{path}: load_in_8bit")
    if four and eight:
        raise MemfitError(f"{path}: load_in_4bit and load_in_8bit are both true (BitsAndBytesConfig refuses that)")
    if not (four or eight):
        raise MemfitError(f"{path}: neither load_in_4bit nor load_in_8bit is true: nothing to quantize")
    q = {"method": "4bit" if four else "8bit",
         "quant_type": str(raw.get("bnb_4bit_quant_type") or "fp4"),
         "double_quant": as_bool(raw.get("bnb_4bit_use_double_quant", False), f"{path}: bnb_4bit_use_double_quant"),
         "compute_dtype": dtype_name(raw.get("bnb_4bit_compute_dtype") or "float32", f"{path}: bnb_4bit_compute_dtype"),
         "quant_storage": dtype_name(raw.get("bnb_4bit_quant_storage") or "uint8", f"{path}: bnb_4bit_quant_storage")}
    skip = raw.get("llm_int8_skip_modules")
    if skip:
        q["skip_modules"] = tuple(skip)
    out = Sourced()
    out.set("quantization", q, f"{path}")
    return out
