"""The recipes outside DeepSpeed: a plain PyTorch loop or the Trainer, DDP, FSDP1 and FSDP2."""
