"""The DeepSpeed replay: ``deepspeed.initialize`` cut into phases, and sizes read off its objects."""
