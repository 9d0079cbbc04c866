"""What the user trains: full fine-tuning or a parameter-efficient method, as typed settings.

Parsed once at the edge (CLI flags, scenario YAML, or a PEFT ``adapter_config.json``); the core
never sees raw dicts. ``memfit.core.peft.params.apply_peft`` turns a ``PeftSpec`` and a ``ModelShape``
into the trained model's parameters.
"""

from __future__ import annotations

from typing import Any

from memfit.core.lean_dataclass import dataclass


PROMPT_METHODS = frozenset({"prompt", "p_tuning", "multitask_prompt_tuning", "cpt"})
"""Methods that prepend ``num_virtual_tokens`` learned embeddings to every input sequence."""
KV_PREFIX_METHODS = frozenset({"prefix", "cartridge"})
"""Methods that prepend ``num_virtual_tokens`` learned keys and values to every layer's attention."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PeftSpec:
    """A PEFT method and its options (only the fields of the chosen method matter)."""

    method: str = "full"
    """``full``, ``freeze``, ``prefix``, ``prompt``, ``lora``, or another of peft's tuners by its
    ``peft_type`` in lower case (``ia3``, ``loha``, ``p_tuning`` ...: ``memfit.core.peft.tuners``)."""
    num_virtual_tokens: int = 20
    """prefix/prompt: virtual tokens prepended to every sequence."""
    prefix_projection: bool = False
    """prefix: reparameterize through an MLP encoder (P-tuning v2 / the seed's prefix encoder)."""
    encoder_hidden_size: int | None = None
    """prefix with projection: width of the encoder MLP (peft default: token_dim, i.e. head_dim x kv heads)."""
    lora_r: int = 8
    lora_alpha: int | float = 8
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
    target_modules_pattern: str | None = None
    """lora: peft's string form of ``target_modules``: a regular expression a module name must match
    in full (``re.fullmatch``), or ``all-linear`` (every Linear/Conv1D layer but the output head).
    Used instead of ``target_modules`` when set."""
    use_dora: bool = False
    """lora: DoRA, which adds one trainable magnitude vector (the layer's output width) per layer."""
    task_type: str | None = None
    """peft ``TaskType`` (``CAUSAL_LM``, ``SEQ_2_SEQ_LM``, ``SEQ_CLS``, ``TOKEN_CLS``,
    ``QUESTION_ANS``, ``FEATURE_EXTRACTION``); ``None``: derived from the model's architecture."""
    token_dim: int | None = None
    """prefix/prompt: peft's ``token_dim`` as saved in an adapter_config.json (``None``: from the
    model, as peft's ``_prepare_prompt_learning_config`` derives it)."""
    num_layers: int | None = None
    """prefix: peft's ``num_layers`` as saved in an adapter_config.json (``None``: from the model)."""
    num_transformer_submodules: int | None = None
    """prompt: peft's ``num_transformer_submodules`` (``None``: 2 for SEQ_2_SEQ_LM, else 1)."""
    lora_dropout: float = 0.0
    """lora: ``lora_dropout``, the dropout on each adapted layer's input to the adapter (it keeps a mask
    and the dropped copy of the input per adapted layer while training)."""
    exclude_modules: tuple[str, ...] = ()
    """Module name suffixes never adapted (peft's ``exclude_modules`` as a list)."""
    exclude_pattern: str | None = None
    """peft's ``exclude_modules`` as one regular expression (``re.fullmatch``)."""
    layers_to_transform: tuple[int, ...] = ()
    """Only adapt modules in these layer indices (empty: every layer)."""
    layers_pattern: tuple[str, ...] = ()
    """The module list names that hold the layers (``layers``, ``h``), for ``layers_to_transform``."""
    rank_pattern: tuple[tuple[str, int], ...] = ()
    """lora: per-module ranks, peft's ``rank_pattern`` as (pattern, r) pairs."""
    alpha_pattern: tuple[tuple[str, float], ...] = ()
    """lora: per-module alphas (scale only: no memory effect)."""
    lora_fa: bool = False
    """lora: trained with peft's LoRA-FA optimizer (``peft.optimizers.create_lorafa_optimizer``), which
    freezes every ``lora_A`` and optimizes only ``lora_B``."""
    settings: tuple[tuple[str, Any], ...] = ()
    """Every other tuner's own ``adapter_config.json`` keys that size it, as (key, value) pairs in
    key order, JSON lists as tuples and objects as tuples of pairs (read by
    ``memfit.core.peft.tuners``)."""
    experts: tuple["PeftSpec", ...] = ()
    """X-LoRA: its LoRA experts, read from the folders its ``adapters`` names, in that order (peft loads
    them as adapters ``0``, ``1``, ...: ``memfit.core.peft.tuners.xlora``)."""
    notes: tuple[str, ...] = ()
    """What reading the method's settings resolved, assumed or ignored, said in the plan."""

    @property
    def prompt_tokens(self) -> int:
        """Virtual tokens prepended to every input sequence (prompt tuning, P-tuning, multitask prompt
        tuning, CPT); 0 for other methods."""
        return self.num_virtual_tokens if self.method in PROMPT_METHODS else 0

    @property
    def prefix_tokens(self) -> int:
        """Virtual keys/values prepended in every layer's attention (prefix tuning, Cartridges); 0 else."""
        return self.num_virtual_tokens if self.method in KV_PREFIX_METHODS else 0

    def setting(self, key: str, default: Any = None) -> Any:
        """The value of tuner setting ``key`` (``default`` if absent)."""
        for k, v in self.settings:
            if k == key:
                return v
        return default
