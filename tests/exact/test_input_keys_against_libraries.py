"""The key lists memfit checks input files against (``memfit.core.inputs.keys``) are the libraries' own,
read here from the installed transformers, accelerate and (when installed) TRL: a release that adds,
renames or drops a key fails this test until the list follows it."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from memfit.core.inputs import keys

transformers = pytest.importorskip("transformers")


def test_training_arguments_keys_are_transformers():
    assert keys.TRAINING_ARGS_KEYS == {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    assert not keys.LEGACY_TRAINING_ARGS_KEYS & keys.TRAINING_ARGS_KEYS  # older releases' only
    seq2seq = {f.name for f in dataclasses.fields(transformers.Seq2SeqTrainingArguments)}
    assert keys.SEQ2SEQ_TRAINING_ARGS_KEYS == seq2seq - keys.TRAINING_ARGS_KEYS


def _json_kinds(annotation) -> tuple[str, ...] | None:
    """What JSON a dataclass annotation admits; None for an object type (not checked)."""
    import enum
    import types
    import typing

    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    kinds: set[str] = set()
    for arm in typing.get_args(annotation) if union else (annotation,):
        origin = typing.get_origin(arm) or arm
        if arm is type(None):
            kinds.add("null")
        elif origin is typing.Literal:
            kinds |= {"bool" if isinstance(v, bool) else type(v).__name__ for v in typing.get_args(arm)}
        elif origin in (bool, int, dict, list):
            kinds.add(origin.__name__)
        elif origin is float:
            kinds |= {"float", "int"}
        elif origin is str or (isinstance(origin, type) and issubclass(origin, enum.Enum)):
            kinds.add("str")
        else:
            return None
    return tuple(sorted(kinds))


def test_training_arguments_types_are_transformers_annotations():
    """The JSON types memfit admits for a TrainingArguments key it does not read (a wrong one is refused,
    where the Trainer would fail mid-run) are read from transformers' own annotations."""
    import typing

    hints = typing.get_type_hints(transformers.Seq2SeqTrainingArguments)
    derived = {f.name: _json_kinds(hints[f.name]) for f in dataclasses.fields(transformers.Seq2SeqTrainingArguments)}
    assert keys.TRAINING_ARGS_TYPES == {k: v for k, v in derived.items() if v is not None}
    assert {k for k, v in derived.items() if v is None} == {"generation_config", "parallelism_config"}


def test_sft_config_keys_are_trls():
    trl = pytest.importorskip("trl", reason="TRL is not installed here; its 1.16 list was read from its release")
    ta = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    assert keys.SFT_CONFIG_KEYS == {f.name for f in dataclasses.fields(trl.SFTConfig)} - ta
    assert not keys.LEGACY_SFT_KEYS & keys.SFT_CONFIG_KEYS


def test_accelerate_keys_are_accelerates():
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import launch_command_parser
    from accelerate.utils import DistributedType, PrecisionType

    assert keys.ACCELERATE_KEYS == {f.name for f in dataclasses.fields(ClusterConfig)}
    groups = {g.title: {a.dest for a in g._group_actions} for g in launch_command_parser()._action_groups}
    assert keys.ACCELERATE_FSDP_KEYS == groups["FSDP Arguments"]
    assert keys.ACCELERATE_DEEPSPEED_KEYS == groups["DeepSpeed Arguments"]
    assert set(keys.ACCELERATE_DISTRIBUTED_TYPES) == {d.value for d in DistributedType}
    assert set(keys.ACCELERATE_MIXED_PRECISION) == {p.value for p in PrecisionType}


def test_bitsandbytes_config_keys_are_transformers():
    cfg = transformers.BitsAndBytesConfig
    params = set(inspect.signature(cfg.__init__).parameters) - {"self", "kwargs"}
    assert keys.BNB_CONFIG_KEYS == params | set(cfg(load_in_4bit=True).to_dict())
    for storage in keys.BNB_QUANT_STORAGE:
        cfg(load_in_4bit=True, bnb_4bit_quant_storage=storage)  # accepted
    with pytest.raises(ValueError):
        cfg(load_in_4bit=True, bnb_4bit_quant_storage="int4")
