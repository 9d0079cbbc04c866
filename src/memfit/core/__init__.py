"""The pure core: no torch, deepspeed, transformers or peft imports at module level."""
