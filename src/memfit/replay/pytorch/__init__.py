"""The replays outside DeepSpeed: a plain PyTorch loop, DDP, FSDP1/FSDP2 and bitsandbytes models."""
