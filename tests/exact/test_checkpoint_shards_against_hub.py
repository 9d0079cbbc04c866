"""memfit's checkpoint shards (memfit.core.checkpoint) against huggingface_hub's own splitter, the
one transformers' save_pretrained calls: the same tensors in the same files, for shard sizes of
several transformers versions."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
hub = pytest.importorskip("huggingface_hub")

from memfit.core.catalog import resolve_model_config  # noqa: E402
from memfit.core.checkpoint import checkpoint_key, layout_from_config  # noqa: E402
from memfit.core.ledger.context import is_adapter_param  # noqa: E402
from memfit.core.shapes import build_model_shape  # noqa: E402
from huggingface_hub.serialization._base import parse_size_to_int  # noqa: E402

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@pytest.mark.parametrize("model,max_shard", [("meta-llama/Llama-2-7b-hf", "10GB"), ("meta-llama/Llama-2-7b-hf", "2GB"),
                                             ("meta-llama/Meta-Llama-3-8B", "5GB"), ("gpt2-large", "500MB")])
def test_same_files_as_split_torch_state_dict_into_shards(model, max_shard):
    source = resolve_model_config(model)
    shape = build_model_shape(source)
    params = [(checkpoint_key(p.name), p.numel, p.shape) for p in shape.params if not is_adapter_param(p.name)]
    layout = layout_from_config([(k, n) for k, n, _ in params], source.config,
                                max_shard_size=parse_size_to_int(max_shard))
    dtype = DTYPES[layout.saved_dtype]
    state = {k: torch.empty(shape, dtype=dtype, device="meta") for k, _, shape in params}
    split = hub.split_torch_state_dict_into_shards(state, max_shard_size=max_shard)
    theirs = [tuple(split.filename_to_tensors[f]) for f in sorted(split.filename_to_tensors)]
    ours = [tuple(k for k, _ in shard) for shard in layout.shards]
    assert ours == theirs
