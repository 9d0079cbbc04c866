"""What a replay runs: the model config, the PEFT method, the DeepSpeed JSON and the training loop.

A ``ReplaySpec`` is the only input of the replay child (``python -m memfit.replay.child``); it is
frozen, validated once, and round-trips through JSON so a recorded measurement carries the exact
recipe that produced it. It is built from a memfit ``Scenario`` by ``spec_from_scenario`` or field
by field (tests, fixtures).

This module is pure: no torch, deepspeed, transformers or peft import.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from memfit.core.ledger_types import ALL_PHASES as PHASES
from memfit.core.peft.spec import PeftSpec
from memfit.core.scenario.types import DTYPES, Scenario
from memfit.errors import MemfitError

ACCELERATORS = ("cpu", "cuda")
SAVE_MODES = ("auto", "save_16bit_model", "consolidate", "never")
FAULT_KINDS = ("raise", "oom", "kill", "hang")
LAUNCHERS = ("fake", "torchrun")

LAYER_COUNT_KEYS: dict[str, tuple[str, ...]] = {
    "gptj": ("n_layer",),
    "gpt2": ("n_layer",),
    "codegen": ("n_layer",),
    "bloom": ("n_layer",),
    "gpt_neo": ("num_layers",),
    "mpt": ("n_layers",),
    "t5": ("num_layers", "num_decoder_layers"),
    "mt5": ("num_layers", "num_decoder_layers"),
    "umt5": ("num_layers", "num_decoder_layers"),
}
"""config.json keys holding the block count, per ``model_type`` (as the transformers config class
names them, i.e. the target of its ``attribute_map`` entry for ``num_hidden_layers``); every other
model type uses ``num_hidden_layers``. T5's ``num_decoder_layers`` is set only when present and not
null (null means "same as ``num_layers``")."""

PER_LAYER_LIST_KEYS = ("layer_types",)
"""config.json lists with one entry per block (Llama/Qwen2/Mistral in transformers >= 4.5x),
truncated to the new block count."""


def override_layers(config: Mapping[str, Any], layers: int) -> dict[str, Any]:
    """``config`` with ``layers`` transformer blocks instead of its own count; every shape unchanged.

    Blocks are identical, so a replay with fewer blocks has the same per-parameter shapes, the same
    largest parameter and the same per-block activations; only the block count (and what scales with
    it, e.g. a prefix encoder's output width ``num_layers x 2 x hidden``) changes.
    """
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise MemfitError(f"--layers must be a positive integer, got {layers!r}")
    out = copy.deepcopy(dict(config))
    model_type = out.get("model_type")
    if not isinstance(model_type, str):
        raise MemfitError("model config has no model_type; cannot override its layer count")
    keys = LAYER_COUNT_KEYS.get(model_type, ("num_hidden_layers",))
    primary = keys[0]
    old = out.get(primary, out.get("num_hidden_layers"))
    out[primary] = layers
    for key in keys[1:]:
        if out.get(key) is not None:
            out[key] = layers
    if primary != "num_hidden_layers" and "num_hidden_layers" in out:
        out["num_hidden_layers"] = layers
    for key in PER_LAYER_LIST_KEYS:
        value = out.get(key)
        if isinstance(value, list) and isinstance(old, int) and len(value) == old:
            out[key] = value[:layers]
    if model_type == "gpt_neo" and "attention_types" in out:
        # GPTNeoConfig expands attention_types ([[["global","local"], 12]]) to one entry per layer
        # and checks the total equals num_layers: repeat the first pattern up to ``layers``.
        pattern = out["attention_types"][0][0]
        if layers % len(pattern):
            raise MemfitError(f"gpt_neo layers must be a multiple of {len(pattern)}, got {layers}")
        out["attention_types"] = [[pattern, layers // len(pattern)]]
    return out


def parse_fault(text: str) -> tuple[str, str, int | None]:
    """``PHASE:KIND[:RANK]`` as (phase, kind, rank or None for every rank); a bad RANK is -1."""
    phase, _, rest = text.partition(":")
    kind, sep, rank = rest.partition(":")
    if not sep:
        return phase, kind, None
    return phase, kind, int(rank) if rank.isdigit() else -1


def peft_to_dict(spec: PeftSpec) -> dict[str, Any]:
    """A ``PeftSpec`` as plain JSON types (tuples become lists)."""
    return {f.name: _plain(getattr(spec, f.name)) for f in dataclasses.fields(spec)}


def peft_from_dict(data: Mapping[str, Any]) -> PeftSpec:
    """Inverse of ``peft_to_dict``; lists become tuples, unknown keys are refused."""
    known = {f.name for f in dataclasses.fields(PeftSpec)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise MemfitError(f"replay spec: unknown PEFT fields {', '.join(unknown)}")
    return PeftSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplaySpec:
    """One real ``deepspeed.initialize`` plus a few training steps, on one rank of a W-rank world.

    The child builds the model from ``model_config`` with random weights in ``load_dtype`` (as
    ``from_pretrained(torch_dtype=...)`` would hold it), applies ``peft`` with the real peft
    library, calls ``deepspeed.initialize(model=..., model_parameters=..., config=deepspeed_config)``,
    runs ``steps`` optimizer steps on random token batches and saves a 16-bit model. With the
    ``fake`` launcher it does so as rank ``rank`` of a one-process fake world of ``world_size``
    ranks (torch's ``fake`` process group: collectives move no data, partition sizes are the real
    ones); with ``torchrun`` every one of the ``world_size`` ranks is a real process and rank 0's
    measurement is the result.
    """

    name: str
    """Case name (fixture file stem, report label)."""
    model_config: dict[str, Any] = field(hash=False)
    """The model's config.json (before the ``layers`` override)."""
    layers: int | None = None
    """Build this many blocks instead of the config's count (same shapes, fewer blocks)."""
    peft: PeftSpec = field(default_factory=PeftSpec)
    deepspeed_config: dict[str, Any] = field(hash=False)
    """The DeepSpeed JSON with "auto" resolved, as handed to ``deepspeed.initialize``. The child
    sets ``train_micro_batch_size_per_gpu`` to ``micro_batch`` and ``train_batch_size`` to
    micro_batch x gradient_accumulation_steps x world_size (recorded in the measurement)."""
    load_dtype: str = "fp32"
    """dtype the model is built in: ``from_pretrained``'s ``torch_dtype`` (fp32 is its default)."""
    zero_init: bool = False
    """Build the base model with transformers' ``HfDeepSpeedConfig`` alive, so transformers builds
    it under ``deepspeed.zero.Init(config_dict_or_path=deepspeed_config)`` (ZeRO-3 only); the PEFT
    modules are added afterwards, outside Init, as a user script does."""
    model_parameters: str = "trainable"
    """``trainable``: pass only requires_grad params (the seed's ``model.prefix_encoder.parameters()``);
    ``all``: pass ``model.parameters()``."""
    world_size: int = 1
    rank: int = 0
    """The rank measured (``fake``); with ``torchrun`` the rank of the process that measured it
    (``run_replay`` takes 0 and returns rank 0's measurement)."""
    launcher: str = "fake"
    """``fake``: one child process plays rank ``rank`` of ``world_size`` on torch's fake process
    group (``memfit.replay.fake_world``); ``torchrun``: ``python -m torch.distributed.run
    --standalone --nproc_per_node world_size`` starts ``world_size`` children on one host, each
    joins a real process group (DeepSpeed's backend for the accelerator: gloo on the CPU
    accelerator without oneCCL, nccl on cuda, where each rank takes the GPU ``LOCAL_RANK``)."""
    accelerator: str = "cpu"
    """``cpu``: DeepSpeed's CPU accelerator (``DS_ACCELERATOR=cpu``), everything in host memory;
    ``cuda``: one GPU plays rank ``rank``."""
    emulate_capacity_bytes: int | None = None
    """cuda: cap the caching allocator at this many bytes through
    ``torch.cuda.set_per_process_memory_fraction(capacity / total)`` to emulate a smaller card. The
    cap applies to what the allocator reserves; the CUDA context is outside it, so to emulate a card
    of total T give T minus the context size (``device_driver_used_end_bytes`` of the first phase
    minus its reserved bytes measures the context)."""
    seq_len: int = 128
    micro_batch: int = 1
    steps: int = 2
    """Optimizer steps (each runs gradient_accumulation_steps forward/backward micro-steps)."""
    max_extra_steps: int = 8
    """When the fp16 loss scaler skipped every one of the ``steps`` (overflow: no optimizer state is
    created), run up to this many more steps until one is taken (each skip halves the scale)."""
    gradient_checkpointing: bool = False
    attention: str = "sdpa"
    """``attn_implementation`` the model is built with (``sdpa`` or ``eager``)."""
    save: str = "auto"
    """``auto``: ``engine.save_16bit_model`` unless ZeRO-3 without
    ``stage3_gather_16bit_weights_on_model_save`` (then no save phase); ``save_16bit_model``: always
    call it; ``consolidate``: measure ``engine._zero3_consolidated_16bit_state_dict()`` (ZeRO-3);
    ``never``: no save phase."""
    host_tracker: bool = True
    """Track every host (and device) tensor allocation with torch.profiler's memory events."""
    alloc_sequence: bool = False
    """Keep the training loop's allocation sequence (every host tensor allocated and freed from the
    first forward to the last optimizer step, ``Measurement.alloc_sequence``); needs ``host_tracker``."""
    seed: int = 0
    threads: int | None = None
    """``torch.set_num_threads`` in the child (None: torch's default)."""
    framework: str = "deepspeed"
    """``deepspeed`` (the recipe above) or ``torch``/``ddp``/``fsdp``/``fsdp2``: the loop of
    ``memfit.replay.pytorch.child`` (a plain PyTorch loop as the Trainer runs it), no DeepSpeed."""
    training: dict[str, Any] = field(default_factory=dict, hash=False)
    """Non-DeepSpeed frameworks: ``memfit.core.frameworks.pytorch.TorchSettings`` fields."""
    quantization: dict[str, Any] = field(default_factory=dict, hash=False)
    """``QuantSettings`` fields (bitsandbytes quantization of the base model); empty: none."""
    ddp: dict[str, Any] = field(default_factory=dict, hash=False)
    """``DdpSettings`` fields (framework ``ddp``)."""
    fsdp: dict[str, Any] = field(default_factory=dict, hash=False)
    """``FsdpSettings`` fields (framework ``fsdp``/``fsdp2``)."""
    evaluation: dict[str, Any] = field(default_factory=dict, hash=False)
    """``EvalSettings`` fields (framework ``torch``): after the steps, ``eval.forward`` runs the real
    ``Seq2SeqTrainer.evaluate()`` on one batch and, with ``generate``, ``eval.generate`` runs it with
    ``predict_with_generate`` (``model.generate`` then the loss); empty: no evaluation."""
    fault: str | None = None
    """Harness self-test only: ``PHASE:KIND`` injects a failure when PHASE starts; KIND is
    ``raise`` (RuntimeError), ``oom`` (an impossible allocation on the device), ``kill``
    (SIGKILL itself) or ``hang`` (sleep until the parent's timeout). ``PHASE:KIND:RANK`` injects
    it on rank RANK only (with ``torchrun``, the other ranks then wait for it in a collective)."""

    def __post_init__(self) -> None:
        if not isinstance(self.model_config, Mapping) or "model_type" not in self.model_config:
            raise MemfitError("replay spec: model_config must be a config.json object with a model_type")
        if self.layers is not None and (isinstance(self.layers, bool) or self.layers < 1):
            raise MemfitError(f"replay spec: layers must be a positive integer, got {self.layers!r}")
        if self.framework == "deepspeed" and (not isinstance(self.deepspeed_config, Mapping) or not self.deepspeed_config):
            raise MemfitError("replay spec: deepspeed_config must be a non-empty DeepSpeed JSON object")
        if self.load_dtype not in DTYPES:
            raise MemfitError(f"replay spec: load_dtype must be one of {', '.join(DTYPES)}, got {self.load_dtype!r}")
        if self.model_parameters not in ("trainable", "all"):
            raise MemfitError(f"replay spec: model_parameters must be 'trainable' or 'all', got {self.model_parameters!r}")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise MemfitError(f"replay spec: need 0 <= rank < world_size, got rank {self.rank} of {self.world_size}")
        if self.launcher not in LAUNCHERS:
            raise MemfitError(f"replay spec: launcher must be 'fake' or 'torchrun', got {self.launcher!r}")
        if self.accelerator not in ACCELERATORS:
            raise MemfitError(f"replay spec: accelerator must be 'cpu' or 'cuda', got {self.accelerator!r}")
        if self.emulate_capacity_bytes is not None:
            if self.accelerator != "cuda":
                raise MemfitError("replay spec: emulate_capacity_bytes needs accelerator 'cuda'")
            if self.emulate_capacity_bytes <= 0:
                raise MemfitError(f"replay spec: emulate_capacity_bytes must be positive, got {self.emulate_capacity_bytes}")
        if self.seq_len < 1 or self.micro_batch < 1 or self.steps < 0 or self.max_extra_steps < 0:
            raise MemfitError(
                f"replay spec: need seq_len >= 1, micro_batch >= 1, steps >= 0, max_extra_steps >= 0; got "
                f"{self.seq_len}, {self.micro_batch}, {self.steps}, {self.max_extra_steps}"
            )
        if self.attention not in ("sdpa", "eager"):
            raise MemfitError(f"replay spec: attention must be 'sdpa' or 'eager', got {self.attention!r}")
        if self.evaluation and self.framework != "torch":
            raise MemfitError("replay spec: evaluation is replayed for framework torch only (the Trainer's "
                              "evaluate() in one process)")
        if self.save not in SAVE_MODES:
            raise MemfitError(f"replay spec: save must be one of {', '.join(SAVE_MODES)}, got {self.save!r}")
        if self.zero_init and self.zero_stage != 3:
            raise MemfitError("replay spec: zero_init needs ZeRO stage 3 in the DeepSpeed config")
        if self.fault is not None:
            phase, kind, rank = parse_fault(self.fault)
            if phase not in PHASES or kind not in FAULT_KINDS or not (rank is None or 0 <= rank < self.world_size):
                raise MemfitError(
                    f"replay spec: fault must be PHASE:KIND[:RANK] with PHASE in {', '.join(PHASES)}, KIND in "
                    f"{', '.join(FAULT_KINDS)} and 0 <= RANK < world_size, got {self.fault!r}"
                )

    @property
    def zero_stage(self) -> int:
        zero = self.deepspeed_config.get("zero_optimization") or {}
        return int(zero.get("stage", 0))

    def effective_model_config(self) -> dict[str, Any]:
        """The config the child builds: ``model_config`` with the ``layers`` override applied."""
        if self.layers is None:
            return copy.deepcopy(dict(self.model_config))
        return override_layers(self.model_config, self.layers)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = peft_to_dict(value) if f.name == "peft" else _plain(value)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReplaySpec:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise MemfitError(f"replay spec: unknown fields {', '.join(unknown)}")
        kwargs = dict(data)
        if "peft" in kwargs:
            kwargs["peft"] = peft_from_dict(kwargs["peft"])
        return cls(**kwargs)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ReplaySpec:
        return cls.from_dict(json.loads(text))


def spec_from_scenario(
    scenario: Scenario,
    *,
    model_config: Mapping[str, Any] | None = None,
    layers: int | None = None,
    steps: int = 2,
    accelerator: str | None = None,
    emulate_capacity_bytes: int | None = None,
    world_size: int | None = None,
    launcher: str = "fake",
    name: str | None = None,
    **overrides: Any,
) -> ReplaySpec:
    """The replay of ``scenario``: its model, PEFT method, DeepSpeed JSON, load and train settings.

    ``model_config`` defaults to the config.json ``memfit.core.catalog.resolve_model_config`` finds
    for ``scenario.model_ref``; ``accelerator`` to the scenario's; ``world_size`` to its GPU count;
    ``launcher`` is ``fake`` (one process, fake process group) or ``torchrun`` (W real processes).
    ``overrides`` set any other ``ReplaySpec`` field (``save``, ``threads``, ``fault`` ...).
    """
    if model_config is None:
        from memfit.core.catalog import resolve_model_config

        model_config = resolve_model_config(scenario.model_ref).config_dict()
    if scenario.eval.enabled:
        overrides = {"evaluation": _plain({k: v for k, v in dataclasses.asdict(scenario.eval).items() if k != "source"}),
                     **overrides}
    if scenario.framework != "deepspeed":
        overrides = {"framework": scenario.framework, "training": _plain(dataclasses.asdict(scenario.torch)),
                     "quantization": _plain(dataclasses.asdict(scenario.quant)) if scenario.quant.enabled else {},
                     "ddp": _plain(dataclasses.asdict(scenario.ddp)), "fsdp": _plain(dataclasses.asdict(scenario.fsdp)),
                     **overrides}
    elif not scenario.deepspeed_json:
        raise MemfitError(f"scenario {scenario.name!r} has no DeepSpeed JSON to replay")
    return ReplaySpec(
        name=name or scenario.name,
        model_config=_plain(model_config),
        layers=layers,
        peft=scenario.peft,
        deepspeed_config=_plain(scenario.deepspeed_json),
        load_dtype=scenario.load.dtype,
        zero_init=scenario.load.zero_init,
        model_parameters=scenario.train.model_parameters,
        world_size=world_size if world_size is not None else scenario.world_size,
        rank=0,
        launcher=launcher,
        accelerator=accelerator or scenario.accelerator,
        emulate_capacity_bytes=emulate_capacity_bytes,
        seq_len=scenario.train.seq_len,
        micro_batch=scenario.train.micro_batch,
        steps=steps,
        gradient_checkpointing=scenario.train.gradient_checkpointing,
        attention=scenario.train.attention,
        **overrides,
    )


def _plain(value: Any) -> Any:
    """``value`` in plain JSON types: mappings to dicts, tuples/lists to lists."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
