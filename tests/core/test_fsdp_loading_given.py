"""``load.fsdp_loading``: a script's own FSDP loader, given (issue 20, loading paths). Answer.AI's
fsdp_qlora train.py does not load through ``from_pretrained``: with ``low_memory`` rank 0 quantizes
each weight on its GPU and keeps it on its host, the other ranks on the meta device. Given as
``rank0_host_quantized``, the plan books exactly what the stack's own path of that name books
(transformers 4.45's ``from_pretrained`` under cpu_ram_efficient_loading), whatever transformers the
stack names; a bad value or a non-FSDP framework is one line."""

import pytest

from memfit.core.plan import make_plan
from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.inputs import ScenarioInputs
from memfit.core.stack.transformers import fsdp_efficient_loading
from memfit.errors import MemfitError

BASE = dict(model="meta-llama/Meta-Llama-3-8B", peft_method="lora", framework="fsdp", precision="bf16",
            load_dtype="bf16", gpus="2xrtx3090", cpu_ram="128GiB", seq_len=512, micro_batch=1,
            gradient_checkpointing=True,
            quantization={"method": "4bit", "quant_type": "nf4", "double_quant": True, "compute_dtype": "bf16",
                          "quant_storage": "bf16"},
            fsdp={"sharding_strategy": "FULL_SHARD", "use_orig_params": False, "cpu_offload": False,
                  "cpu_ram_efficient_loading": True, "wrap_policy": "peft"})  # a PEFT model's flat params, as torch allows


def plan(tmp_path, **kw):
    sc = build_scenario(ScenarioInputs(**{**BASE, **kw}))
    return sc, make_plan(sc)


def _load_figures(p):
    load = next(ph for ph in p.phases if ph.name == "load")
    return load


def test_given_loading_books_what_the_same_library_path_books(tmp_path):
    _, old = plan(tmp_path, transformers_version="4.38")
    # 4.38's from_pretrained puts the whole quantized model on every GPU; 4.45's is rank0_host_quantized
    assert fsdp_efficient_loading("4.38", quantized=True)[0] == "every_rank"
    assert fsdp_efficient_loading("4.45", quantized=True)[0] == "rank0_host_quantized"
    _, given = plan(tmp_path, transformers_version="4.38", fsdp_loading="rank0_host_quantized")
    _, lib = plan(tmp_path, transformers_version="4.45")  # from_pretrained's own rank0_host_quantized path
    g, lb, o = (_load_figures(x) for x in (given, lib, old))
    assert g == lb
    assert o != g  # the stack's own 4.38 path differs (every rank's GPU)
    assert given.verdict == lib.verdict


def test_given_loading_is_said_in_the_plan(tmp_path):
    sc, _ = plan(tmp_path, transformers_version="4.38", fsdp_loading="rank0_host_quantized")
    assert sc.load.fsdp_loading == "rank0_host_quantized"
    assert any(n.startswith("FSDP loading rank0_host_quantized (") and "the script's own loader" in n
               for n in sc.input_notes), sc.input_notes


@pytest.mark.parametrize("kw, said", [
    (dict(fsdp_loading="rank0"), "load.fsdp_loading: invalid value 'rank0'; valid: rank0_host, rank0_host_quantized"),
    (dict(fsdp_loading="rank0_host", framework="ddp", fsdp=None), "applies to FSDP only (the framework is ddp)"),
])
def test_bad_fsdp_loading_is_one_line(tmp_path, kw, said):
    with pytest.raises(MemfitError) as e:
        plan(tmp_path, **kw)
    assert said in str(e.value) and "\n" not in str(e.value)
