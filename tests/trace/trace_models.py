"""Small model configs (config.json mappings) the trace tests build, fake and real."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

TINY = {
    "gptj": dict(model_type="gptj", vocab_size=1000, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=256),
    "llama": dict(model_type="llama", vocab_size=1000, hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256),
    "gpt2": dict(model_type="gpt2", vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=256),
}
"""Two-layer models small enough to run for real on the CPU in milliseconds."""


def real_model(config: dict, *, method: str, attention: str, gradient_checkpointing: bool = False,
               num_virtual_tokens: int = 5):
    """The same model the trace builds, with real fp32 CPU tensors, PEFT applied by peft itself."""
    import peft
    import torch
    import transformers

    hf = transformers.CONFIG_MAPPING[config["model_type"]].from_dict(dict(config))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf, attn_implementation=attention, dtype=torch.float32)
    if method == "lora":
        model = peft.get_peft_model(model, peft.LoraConfig(task_type="CAUSAL_LM", r=8, lora_alpha=8))
    elif method == "prefix":
        model = peft.get_peft_model(model, peft.PrefixTuningConfig(
            task_type="CAUSAL_LM", num_virtual_tokens=num_virtual_tokens, prefix_projection=True,
            encoder_hidden_size=config.get("n_embd", config.get("hidden_size"))))
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    return model
