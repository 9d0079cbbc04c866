"""memfit's per-release rules (``memfit.core.stack``) against the released code they cite.

transformers' wheels are fetched from PyPI with their sha256 pinned (``tests/sdist_source.py``):
4.15.0, 4.20.0, 4.31.0, 4.35.0, 4.51.0 and 4.54.0, the first release of each rule memfit switches
on (the last release before each was read by hand: 4.19's ``kwargs.pop("low_cpu_mem_usage",
False)``, 4.30/4.31's ``adamw_hf``, 4.34's missing ``is_fsdp_enabled``, 4.50's ``low_cpu_mem_usage``
still honoured, 4.53's commented-out fused default); and for FSDP's cpu_ram_efficient_loading
4.35.0/4.36.0 (non-rank-0 on meta), 4.38.0/4.39.0 (a bitsandbytes weight quantized on the GPU then
moved to the host; rank 0 only from 4.45: 4.44.0 checked by hand) and 5.0.0 (that branch gone). For each wheel the rule is read off its
source text and compared with what memfit returns for that release.
"""

import re

import pytest

from memfit.core.stack.transformers import fsdp_efficient_loading, low_cpu_mem_usage_default, trainer_default_optim

VERSIONS = ("4.15.0", "4.20.0", "4.31.0", "4.35.0", "4.36.0", "4.38.0", "4.39.0", "4.51.0", "4.54.0", "5.0.0")
FILES = ("transformers/modeling_utils.py", "transformers/training_args.py")


@pytest.fixture(scope="module")
def wheels(request, tmp_path_factory):
    from conftest import sdist_cache
    from sdist_source import SourceUnavailable, wheel_files

    out = {}
    for v in VERSIONS:
        try:
            out[v] = wheel_files("transformers", v, FILES, sdist_cache(request, tmp_path_factory))
        except SourceUnavailable as e:
            pytest.fail(f"transformers {v}'s wheel is needed to check memfit's rules: {e}", pytrace=False)
    return out


def _rules_from_source(mu: str, ta: str) -> dict:
    """What from_pretrained and TrainingArguments do, read off the source text."""
    dropped = '_ = kwargs.pop("low_cpu_mem_usage", None)' in mu or '"_fast_init", "low_cpu_mem_usage"' in mu
    m = re.search(r'low_cpu_mem_usage = kwargs\.pop\("low_cpu_mem_usage", (\w+)\)', mu)
    default = None if dropped else m.group(1)
    fsdp = bool(re.search(r"if is_fsdp_enabled\(\):\s+low_cpu_mem_usage = True", mu))
    device_map = bool(re.search(r"if device_map is not None:\s+if low_cpu_mem_usage is None:\s+low_cpu_mem_usage = True", mu))
    opt = re.search(r'default=\"(adamw_\w+)\"', ta) or re.search(r'default_optim = "(adamw_\w+)"', ta)
    fused = bool(re.search(r'if is_torch_greater_or_equal_than_2_8:\s+default_optim = "adamw_torch_fused"', ta))
    return {"dropped": dropped, "default": default, "fsdp": fsdp, "device_map": device_map,
            "optim": opt.group(1) if opt else None, "fused_on_2_8": fused}


@pytest.mark.parametrize("version", VERSIONS)
def test_low_cpu_mem_usage_rule_matches_the_release(wheels, version):
    r = _rules_from_source(wheels[version][FILES[0]], wheels[version][FILES[1]])
    line = ".".join(version.split(".")[:2])
    plain = low_cpu_mem_usage_default(line, device_map=False, quantized=False, fsdp_efficient=False)[0]
    fsdp = low_cpu_mem_usage_default(line, device_map=False, quantized=False, fsdp_efficient=True)[0]
    if r["dropped"]:
        assert plain and fsdp  # every model loads into a meta-device build
    else:
        assert plain is (r["default"] == "True")  # False, or None read as False
        assert fsdp is (r["fsdp"] or r["default"] == "True")
        if r["default"] == "None":
            assert r["device_map"]  # None becomes True only through a device_map (bitsandbytes sets one)
            assert low_cpu_mem_usage_default(line, device_map=True, quantized=False, fsdp_efficient=False)[0]


@pytest.mark.parametrize("version", [v for v in VERSIONS if v != "4.15.0"])
def test_trainer_default_optim_matches_the_release(wheels, version):
    r = _rules_from_source(wheels[version][FILES[0]], wheels[version][FILES[1]])
    line = ".".join(version.split(".")[:2])
    assert trainer_default_optim(line, "2.4")[0] == r["optim"]
    assert trainer_default_optim(line, "2.8")[0] == ("adamw_torch_fused" if r["fused_on_2_8"] else r["optim"])


@pytest.mark.parametrize("version", VERSIONS)
def test_fsdp_efficient_loading_matches_the_release(wheels, version):
    mu = wheels[version][FILES[0]]
    line = ".".join(version.split(".")[:2])
    meta_elsewhere = bool(re.search(r"is_fsdp_enabled\(\) and not is_local_dist_rank_0\(\)\)?:?\s*\n?\s*map_location = \"meta\"",
                                    mu)) or "is_fsdp_enabled() and not is_local_dist_rank_0() and not is_quantized" in mu \
        or re.search(r"\(is_fsdp_enabled\(\) and not is_local_dist_rank_0\(\)\)", mu) is not None
    quant_to_host = "quantize the parameter on the GPU" in mu and ('param_to = "cpu"' in mu or '.data.to("cpu")' in mu)
    rank0_only = 'param_to = "meta"' in mu
    plain = fsdp_efficient_loading(line, quantized=False)[0]
    quant = fsdp_efficient_loading(line, quantized=True)[0]
    assert plain == ("rank0_host" if meta_elsewhere else "every_rank"), version
    assert quant == ("every_rank" if not quant_to_host else "rank0_host_quantized" if rank0_only else
                     "every_rank_host_quantized"), version


QUANT_FILE = "transformers/utils/quantization_config.py"


@pytest.mark.parametrize("version", ("4.38.0", "4.39.0", "5.0.0"))
def test_bnb_quant_storage_rule_matches_the_release(request, tmp_path_factory, version):
    """``bnb_4bit_quant_storage`` is an argument of BitsAndBytesConfig from 4.39.0; 4.38's ``__init__``
    swallows it in ``**kwargs`` (read off each wheel's quantization_config.py), and the reader then
    says so and plans uint8 storage."""
    from conftest import sdist_cache
    from sdist_source import SourceUnavailable, wheel_files

    from memfit.core.stack.transformers import bnb_reads_quant_storage

    try:
        src = wheel_files("transformers", version, (QUANT_FILE,), sdist_cache(request, tmp_path_factory))[QUANT_FILE]
    except SourceUnavailable as e:
        pytest.fail(f"transformers {version}'s wheel is needed to check memfit's rule: {e}", pytrace=False)
    init = src[src.index("class BitsAndBytesConfig"):]
    init = init[init.index("def __init__"):init.index("):", init.index("def __init__"))]
    takes = "bnb_4bit_quant_storage" in init
    assert "**kwargs" in init  # an unknown keyword is taken, not refused
    line = ".".join(version.split(".")[:2])
    assert bnb_reads_quant_storage(line)[0] is takes


def test_bnb_config_reader_follows_the_quant_storage_rule(tmp_path):
    import json

    from memfit.core.inputs.bnb_config import read_bnb_config
    from memfit.core.stack.transformers import bnb_reads_quant_storage

    p = tmp_path / "bnb.json"
    p.write_text(json.dumps({"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                             "bnb_4bit_quant_storage": "bfloat16"}))
    old = read_bnb_config(str(p), quant_storage_read=bnb_reads_quant_storage("4.38"))
    assert old.values["quantization.quant_storage"] == "uint8"
    assert any("bnb_4bit_quant_storage = bfloat16 is ignored: transformers 4.38" in w for w in old.warnings)
    new = read_bnb_config(str(p), quant_storage_read=bnb_reads_quant_storage("4.39"))
    assert new.values["quantization.quant_storage"] == "bf16" and not new.warnings


@pytest.mark.parametrize("version", VERSIONS)
def test_from_pretrained_dtype_default_matches_the_release(wheels, version):
    """From 5.0 a missing dtype reads as "auto" (the checkpoint's dtype), which memfit's load-dtype
    assumption line says (``scenario/assumptions.py:_load_dtype_why``); before, fp32."""
    auto = bool(re.search(r'if dtype is None:\s+dtype = "auto"', wheels[version][FILES[0]]))
    assert auto is version.startswith("5."), version



@pytest.mark.parametrize("version", VERSIONS)
def test_load_dtype_default_matches_the_release(request, tmp_path_factory, wheels, version):
    """``load_dtype_default`` against the wheel: 5.x loads config.json's dtype ('auto'), 4.x fp32, and a
    bitsandbytes model without dtype is forced to float16 where the release says so (in modeling_utils.py
    up to 4.37, in quantizers/quantizer_bnb_4bit.py from 4.38; 4.15/4.20 had no 4-bit loading)."""
    from conftest import sdist_cache
    from sdist_source import wheel_files

    from memfit.core.stack.transformers import load_dtype_default

    mu = wheels[version][FILES[0]]
    line = ".".join(version.split(".")[:2])
    auto = bool(re.search(r'if dtype is None:\s+dtype = "auto"', mu))
    assert (load_dtype_default(line, config_dtype="bf16", quantized=False)[0] == "bf16") is auto
    if auto:  # _get_dtype resolves "auto" from the config before the quantizer sees it, so bnb keeps it
        body = mu[mu.index("def _get_dtype("):]
        assert body.index('if dtype == "auto":') < body.index("hf_quantizer.update_dtype(dtype)"), version
        assert load_dtype_default(line, config_dtype="bf16", quantized=True)[0] == "bf16"
        return
    if version in ("4.15.0", "4.20.0"):
        return
    text = mu
    if "quantizers/" in mu or "from .quantizers" in mu:
        text = wheel_files("transformers", version, ("transformers/quantizers/quantizer_bnb_4bit.py",),
                           sdist_cache(request, tmp_path_factory))["transformers/quantizers/quantizer_bnb_4bit.py"]
    forced = bool(re.search(r"if torch_dtype is None:.*?torch_dtype = torch\.float16", text, re.S))
    assert forced, version
    assert load_dtype_default(line, config_dtype="bf16", quantized=True)[0] == "fp16"
