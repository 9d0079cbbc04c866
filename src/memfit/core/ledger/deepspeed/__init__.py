"""DeepSpeed's recipes: ``from_pretrained`` and ``deepspeed.initialize`` (cast, move, ZeRO 0-3), the steps."""
