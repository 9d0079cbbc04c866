"""``memfit recommend`` outside DeepSpeed (torch, DDP, FSDP/FSDP2)."""
