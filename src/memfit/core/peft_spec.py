"""What the user trains: full fine-tuning or a parameter-efficient method, as typed settings.

Parsed once at the edge (CLI flags, scenario YAML, or a PEFT ``adapter_config.json``); the core
never sees raw dicts. ``memfit.core.peft.apply_peft`` turns a ``PeftSpec`` and a ``ModelShape``
into the trained model's parameters.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class PeftSpec:
    """A PEFT method and its options (only the fields of the chosen method matter)."""

    method: str = "full"
    """``full``, ``prefix``, ``prompt``, ``lora`` or ``freeze``."""
    num_virtual_tokens: int = 20
    """prefix/prompt: virtual tokens prepended to every sequence."""
    prefix_projection: bool = False
    """prefix: reparameterize through an MLP encoder (P-tuning v2 / the seed's prefix encoder)."""
    encoder_hidden_size: int | None = None
    """prefix with projection: width of the encoder MLP (defaults to the model's hidden size)."""
    lora_r: int = 8
    lora_alpha: int = 8
    target_modules: tuple[str, ...] = ()
    """lora: module name suffixes to adapt (empty: peft's default for the model type)."""
    lora_bias: str = "none"
    """lora: ``none``, ``all`` or ``lora_only`` (which biases train)."""
    modules_to_save: tuple[str, ...] = ()
    """lora/prefix/prompt: modules fully trained as well (e.g. a classifier head)."""
    freeze_patterns: tuple[str, ...] = ()
    """freeze: glob patterns over parameter names to freeze; everything else trains."""
    train_patterns: tuple[str, ...] = ()
    """freeze: glob patterns over parameter names that train; everything else is frozen."""
