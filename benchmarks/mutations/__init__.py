"""The mutation catalogue ``benchmarks/mutation.py`` runs: test selections, the ``Mutation`` type,
one module per area, what is not mutated and why, and what must be caught."""

from __future__ import annotations

from mutations.allocators import ALLOCATOR_MUTATIONS
from mutations.deepspeed import MUTATIONS, UNOBSERVABLE_MUTATIONS
from mutations.frameworks import FRAMEWORK_MUTATIONS
from mutations.inputs import INPUT_MUTATIONS
from mutations.model import Mutation
from mutations.peft_tuners import PEFT_TUNER_MUTATIONS

__all__ = ["ALLOCATOR_MUTATIONS", "FRAMEWORK_MUTATIONS", "INPUT_MUTATIONS", "KNOWN_FAILING", "MUST_BE_CAUGHT", "MUTATIONS",
           "NOT_MUTATED", "PEFT_TUNER_MUTATIONS", "SCORED", "UNOBSERVABLE_MUTATIONS", "Mutation"]

SCORED: tuple[Mutation, ...] = (MUTATIONS + ALLOCATOR_MUTATIONS + FRAMEWORK_MUTATIONS + INPUT_MUTATIONS
                                 + PEFT_TUNER_MUTATIONS)
"""Every scored mutation, in the order the script runs them."""

KNOWN_FAILING: tuple[str, ...] = ()
"""Test node ids deselected in every run, each with its reason here (a selection that fails
unmutated stops the script instead). Empty."""


NOT_MUTATED = {
    "NCCL buffers (alloc/non_pytorch.py)": "an estimate from NCCL's documented default with channel counts NCCL "
    "typically prints; no measurement here can tell 2 from 4 channels, so a mutation could not be caught by one",
    "the lazy-loading CUDA context sizes (alloc/non_pytorch.py)": "the published figures are bare-context readings "
    "without a program to replay (pytorch#86509's lazy reading, 287,047,680 B with a 20 MiB segment, is a GPU it "
    "does not name and is not what the model uses for it)",
    "the expandable segment's address reservation (1 1/8 of the card)": "it sizes the virtual range only; no byte "
    "figure depends on it (an equivalent mutation)",
    "bitsandbytes' paged-state threshold and the 8-bit maps' device copies": "they apply on CUDA only; every "
    "measured comparison here runs the CPU backend, where nothing is paged and the maps stay on the host",
    "either of transformers' two default quantization skips (core/quant.py default_skips: the output-embedding "
    "names, the last parameter's module)": "they coincide on every family built here (the head is the last "
    "parameter or is tied), so a mutation of one alone is equivalent there (tried: bnb-head-quantized survived "
    "for that reason); the head staying unquantized is checked against bitsandbytes in test_quant_against_bnb.py",
    "src/memfit/core/alloc/cuda_caching.py": "it only re-exports the simulator's public names (no rule of its own)",
    "src/memfit/core/alloc/recording.py": "it is the comparison itself (a GPU recording replayed through the "
    "simulator), not a model of memory; no GPU recording exists here to check it against, and its tests are "
    "hand-built traces in torch's documented snapshot format",
    "src/memfit/core/alloc/__init__.py": "no code",
    "src/memfit/core/peft/tuners/__init__.py": "the registry of tuners by peft_type, no shape rule of its own; a tuner "
    "left out of it is refused, which test_every_tuner.py's test_memfit_plans_every_peft_type fails on",
    "src/memfit/core/peft/tuners/ln_tuning.py": "its one rule copies each target module's own parameters (names and "
    "shapes read off the model); the defaults it reads are mutated instead (ln-tuning-llama-final-norm-skipped)",
    "src/memfit/core/ledger/pytorch/__init__.py": "no code",
}
"""What has no mutation, and why. Keys naming a file (``src/...``) are what the coverage test
(tests/robustness/test_mutation_coverage.py) accepts for a module the catalogue must cover."""

MUST_BE_CAUGHT = ("activations-plus-1pct", "pinned-flag-flipped", "staging-copy-dropped-step",
                  "ds-buffer-plus-one", "lora-dimension-plus-one")
"""Issue 13's five: each must be killed by a comparison with something measured."""
