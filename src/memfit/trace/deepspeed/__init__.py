"""DeepSpeed inside a traced step: ZeRO-3's gathered parameters over the traced module order."""
