"""Activation memory: what a training step keeps for backward, per model family (pure arithmetic)."""
