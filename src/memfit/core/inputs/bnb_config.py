"""A ``BitsAndBytesConfig`` as JSON (``BitsAndBytesConfig.to_json_file``, or a model config.json's
``quantization_config``), with transformers 5.24's defaults (``utils/quantization_config.py``):
``bnb_4bit_quant_type`` fp4, ``bnb_4bit_use_double_quant`` false, ``bnb_4bit_compute_dtype``
float32, ``bnb_4bit_quant_storage`` uint8, ``llm_int8_skip_modules`` none (transformers' default
skips; an explicit empty list skips nothing). Types are checked as ``BitsAndBytesConfig.post_init``
checks them; a key it does not have is a warning with the key it most likely misspells (it logs "Unused kwargs" and ignores it); the 8-bit
options memfit does not model (``llm_int8_enable_fp32_cpu_offload``, ``llm_int8_has_fp16_weight``) are
warnings when set."""

from __future__ import annotations

from memfit.core.inputs.common import Sourced, as_bool, as_float, as_names, check_keys, dtype_name, read_mapping
from memfit.core.inputs.keys import BNB_CONFIG_KEYS, BNB_QUANT_STORAGE
from memfit.errors import MemfitError

_QUANT_TYPES = ("fp4", "nf4")
_STORAGE_MODELLED = ("uint8", "float16", "bfloat16", "float32")


def read_bnb_config(path: str, *, quant_storage_read: tuple[bool, str] = (True, "")) -> Sourced:
    """``quant_storage_read``: whether the stack's BitsAndBytesConfig reads ``bnb_4bit_quant_storage``,
    and why not (``stack/transformers.py:bnb_reads_quant_storage``)."""
    raw = read_mapping(path, "BitsAndBytesConfig file")
    where = path
    if "quantization_config" in raw:  # a model's config.json
        if not isinstance(raw["quantization_config"], dict):
            raise MemfitError(f"{path}: quantization_config: invalid value {raw['quantization_config']!r:.60}; "
                              "valid: a BitsAndBytesConfig mapping")
        raw, where = raw["quantization_config"], f"{path}: quantization_config"
    out = Sourced(layer="bnb_config")
    check_keys(raw, BNB_CONFIG_KEYS, where, refuse=False, warnings=out.warnings,
               library="transformers' BitsAndBytesConfig")

    def o(key: str) -> str:
        return f"{where}: {key}"

    if raw.get("quant_method") not in (None, "bitsandbytes"):
        raise MemfitError(f"{o('quant_method')}: {raw['quant_method']!r:.40} is not a bitsandbytes config (memfit "
                          "models bitsandbytes quantization only)")
    four = as_bool(raw.get("load_in_4bit", raw.get("_load_in_4bit", False)), o("load_in_4bit"))
    eight = as_bool(raw.get("load_in_8bit", raw.get("_load_in_8bit", False)), o("load_in_8bit"))
    if four and eight:
        raise MemfitError(f"{where}: load_in_4bit and load_in_8bit are both true (BitsAndBytesConfig refuses that)")
    if not (four or eight):
        raise MemfitError(f"{where}: neither load_in_4bit nor load_in_8bit is true: nothing to quantize")
    quant_type = raw.get("bnb_4bit_quant_type") or "fp4"
    if quant_type not in _QUANT_TYPES:
        raise MemfitError(f"{o('bnb_4bit_quant_type')}: invalid value {quant_type!r:.40}; valid: fp4, nf4 "
                          "(bitsandbytes' 4-bit types)")
    storage = raw.get("bnb_4bit_quant_storage") or "uint8"
    reads_storage, why = quant_storage_read
    if not reads_storage and "bnb_4bit_quant_storage" in raw:
        if storage not in BNB_QUANT_STORAGE:
            raise MemfitError(f"{o('bnb_4bit_quant_storage')}: invalid value {storage!r:.40}; valid: "
                              f"{', '.join(BNB_QUANT_STORAGE)}")
        out.warnings.append(f"{o('bnb_4bit_quant_storage')} = {storage} is ignored: {why}")
        raw = {k: v for k, v in raw.items() if k != "bnb_4bit_quant_storage"}
        storage = "uint8"
    if storage not in BNB_QUANT_STORAGE:
        raise MemfitError(f"{o('bnb_4bit_quant_storage')}: invalid value {storage!r:.40}; valid: "
                          f"{', '.join(BNB_QUANT_STORAGE)}")
    if storage not in _STORAGE_MODELLED:
        raise MemfitError(f"{o('bnb_4bit_quant_storage')}: {storage} is valid but not modelled by memfit (it models "
                          f"{', '.join(_STORAGE_MODELLED)})")
    q = {"method": "4bit" if four else "8bit",
         "quant_type": quant_type,
         "double_quant": as_bool(raw.get("bnb_4bit_use_double_quant", False), o("bnb_4bit_use_double_quant")),
         "compute_dtype": dtype_name(raw.get("bnb_4bit_compute_dtype") or "float32", o("bnb_4bit_compute_dtype")),
         "quant_storage": dtype_name(storage, o("bnb_4bit_quant_storage"),
                                     valid=("uint8", "float16", "bfloat16", "float32"))}
    if raw.get("llm_int8_threshold") is not None:
        as_float(raw["llm_int8_threshold"], o("llm_int8_threshold"))  # no effect on memory
    skip = raw.get("llm_int8_skip_modules")
    if skip is not None:
        q["skip_modules"] = as_names(skip, o("llm_int8_skip_modules"))
    for key, what in (("llm_int8_enable_fp32_cpu_offload", "modules offloaded to the CPU in fp32"),
                      ("llm_int8_has_fp16_weight", "int8 weights kept with fp16 copies")):
        if raw.get(key) is not None and as_bool(raw[key], o(key)):
            out.warnings.append(f"{o(key)} = true is read but not modelled ({what}): the plan is made without it")
    for key, value in q.items():
        written = key == "method" or _BNB_KEY[key] in raw
        out.set(f"quantization.{key}", value, o(_BNB_KEY[key]) + ("" if written else " (BitsAndBytesConfig default)"),
                default=not written)
    return out


_BNB_KEY = {"method": "load_in_4bit/load_in_8bit", "quant_type": "bnb_4bit_quant_type",
            "double_quant": "bnb_4bit_use_double_quant", "compute_dtype": "bnb_4bit_compute_dtype",
            "quant_storage": "bnb_4bit_quant_storage", "skip_modules": "llm_int8_skip_modules"}
