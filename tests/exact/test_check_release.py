"""``memfit.check(model)`` runs in the training process: the model was built by the transformers installed
there, so its shape follows that release (Falcon: ``families.falcon.at_release``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from memfit.core.peft.prompt_learning import has_kv_heads_key  # noqa: E402
from memfit.core.stack.releases import at_least  # noqa: E402
from memfit.exact.check import model_shape_of  # noqa: E402
from tests.installed_stack import TRANSFORMERS_LINE  # noqa: E402


@pytest.mark.parametrize("new_arch", [False, True])
def test_falcon_in_check_follows_the_installed_release(new_arch):
    config = transformers.FalconConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                       num_kv_heads=2, new_decoder_architecture=new_arch)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    arch = model_shape_of(model).arch
    assert has_kv_heads_key(arch) == ("num_key_value_heads" in model.config.to_dict())
    assert arch.layout.shared_attention == at_least(TRANSFORMERS_LINE, "5.25")
