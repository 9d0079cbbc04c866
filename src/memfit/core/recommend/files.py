"""``memfit recommend --out DIR``: each configuration as the user's own files, changed.

``DIR/rank<N>-<slug>/`` holds, for configuration N:

- the user's files with only the settings it changes changed (``user_files``), under their own
  names: the DeepSpeed JSON, the TrainingArguments/SFTConfig (JSON or YAML, as given), the
  accelerate config YAML, the BitsAndBytesConfig JSON (a new one when the configuration adds 4-bit
  quantization); each with ``<name>.diff``, a unified diff against the user's file;
- ``train.py.diff``: the few lines of the training script that change (``script_diff``), when any;
- ``scenario.yaml``: the scenario ``memfit plan`` runs as written, naming those files. After writing,
  each scenario is planned again and its verdict figures compared with the ones recommend shows: a
  difference is a memfit bug, and the configuration's notes say so.

Nothing that exists is ever overwritten: if any target exists, nothing is written and the error
names it; files are created with ``O_EXCL`` and never through a symbolic link.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from memfit.core.inputs.training_args import relative_path
from memfit.core.recommend.results import Recommendation, RecommendResult
from memfit.core.recommend.user_files import (Placement, UserFile, WrittenFile, edited, mapping_changes, new_file,
                                              place_quantization, place_structure, place_trainer_setting,
                                              read_user_files, scenario_inputs)
from memfit.core.scenario.inputs import ScenarioInputs
from memfit.errors import MemfitError

EXISTS_HINT = "memfit never overwrites a file you have (choose another --out)"

SCENARIO_NAME = "scenario.yaml"
SCRIPT_DIFF_NAME = "train.py.diff"
HEADER = ("memfit recommend: configuration {rank} of {scenario!r}\n"
          "`memfit plan {path}` gives the figures recommend showed; the files beside it are yours, changed\n"
          "(each <file>.diff shows how)")


def slug(c: Any) -> str:
    """A short folder-name tag of the configuration, e.g. ``zero3-optcpu-paramcpu-zinit-ckpt-mb2``."""
    if not hasattr(c, "stage"):  # a non-DeepSpeed candidate (memfit.core.recommend.pytorch.search)
        parts = [c.framework] + ([c.sharding_strategy.lower()] if c.sharding_strategy else []) + \
            (["offload"] if c.cpu_offload else []) + [c.precision, c.optim] + \
            (["4bit"] if c.quantization == "4bit" else []) + (["ckpt"] if c.gradient_checkpointing else []) + \
            [f"mb{c.micro_batch}"]
        return "-".join(parts)
    parts = [f"zero{c.stage}"]
    if c.offload_optimizer != "none":
        parts.append(f"opt{c.offload_optimizer}")
    if c.offload_param != "none":
        parts.append(f"param{c.offload_param}")
    if c.zero_init:
        parts.append("zinit")
    if c.gradient_checkpointing:
        parts.append("ckpt")
    parts.append(f"mb{c.micro_batch}")
    return "-".join(parts)


def _plain_numbers(v: Any) -> Any:
    """Whole-number floats of 10,000 or more (``5e8`` read from JSON) as ints, so a new file prints
    ``500000000`` rather than ``500000000.0``; DeepSpeed reads both the same."""
    if isinstance(v, dict):
        return {k: _plain_numbers(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain_numbers(x) for x in v]
    if isinstance(v, float) and v.is_integer() and abs(v) >= 10_000:
        return int(v)
    return v


# ------------------------------------------------------------------------ one configuration

def _deepspeed_files(result: RecommendResult, rec: Recommendation, files: dict[str, UserFile], p: Placement,
                     user: ScenarioInputs, folder: Path) -> tuple[list[WrittenFile], dict[str, str]]:
    """The patched DeepSpeed JSON where the user keeps it, and the Trainer/script settings it moves."""
    written: list[WrittenFile] = []
    names: dict[str, str] = {}
    base, cand = result.base_candidate, rec.candidate
    ta = files.get("training_args")
    ds_in_ta = ta is not None and "deepspeed" in ta.raw and user.deepspeed is None and user.deepspeed_inline is None
    if "deepspeed" in files and not mapping_changes(files["deepspeed"].raw, rec.deepspeed_json):
        if user.deepspeed is not None:
            names["deepspeed"] = str(Path(user.deepspeed).resolve())  # unchanged: the user's own file
    elif "deepspeed" in files:
        f = files["deepspeed"]
        written.append(edited(f, mapping_changes(f.raw, rec.deepspeed_json)))
        if ds_in_ta and isinstance(ta.raw["deepspeed"], str):
            p.training_args.append((("deepspeed",), str((folder / f.name).resolve())))
        elif user.deepspeed is None:  # named in the accelerate config
            p.accelerate_config.append((("deepspeed_config", "deepspeed_config_file"), str((folder / f.name).resolve())))
        else:
            names["deepspeed"] = f.name
    elif user.deepspeed_inline is not None:  # inline in the scenario: stays inline
        p.scenario["deepspeed_inline"] = rec.deepspeed_json
    elif ds_in_ta:  # inline in the TrainingArguments
        p.training_args.append((("deepspeed",), rec.deepspeed_json))
    else:  # memfit's default config (or accelerate's inline keys): a new file
        name = "ds_config.json"
        written.append(new_file("deepspeed", name, json.dumps(_plain_numbers(rec.deepspeed_json), indent=4) + "\n"))
        if "accelerate_config" in files and (files["accelerate_config"].raw.get("deepspeed_config")):
            p.accelerate_config.append((("deepspeed_config",), {"deepspeed_config_file": str((folder / name).resolve())}))
            p.notes.append("the accelerate config's inline DeepSpeed keys are replaced by deepspeed_config_file "
                           f"{name} (accelerate refuses both)")
        else:
            names["deepspeed"] = name
    for setting in ("micro_batch", "grad_accum", "precision", "gradient_checkpointing", "load_dtype"):
        if getattr(base, setting) != getattr(cand, setting):
            place_trainer_setting(p, files, user, setting, getattr(cand, setting), framework="deepspeed")
    if cand.zero_init != base.zero_init and cand.stage == 3:
        p.scenario["zero_init"] = cand.zero_init
    if cand.low_cpu_mem_usage != base.low_cpu_mem_usage:
        p.scenario["low_cpu_mem_usage"] = cand.low_cpu_mem_usage
    return written, names


def _torch_files(result: RecommendResult, rec: Recommendation, files: dict[str, UserFile], p: Placement,
                 user: ScenarioInputs) -> tuple[list[WrittenFile], dict[str, str]]:
    base, cand = result.base_candidate, rec.candidate
    ci = rec.scenario_inputs
    if (base.framework, base.sharding_strategy, base.cpu_offload) != (cand.framework, cand.sharding_strategy,
                                                                       cand.cpu_offload):
        place_structure(p, files, user, framework=cand.framework, sharding=cand.sharding_strategy,
                        cpu_offload=cand.cpu_offload, fsdp_inputs=user.fsdp)
    for setting in ("precision", "optim", "micro_batch", "grad_accum", "gradient_checkpointing"):
        if getattr(base, setting) != getattr(cand, setting):
            place_trainer_setting(p, files, user, setting, getattr(cand, setting), framework=cand.framework)
    if result.base_load_dtype is not None and ci.load_dtype != result.base_load_dtype:
        place_trainer_setting(p, files, user, "load_dtype", ci.load_dtype, framework=cand.framework)
    if base.quantization != cand.quantization or (cand.quantization != "none" and
                                                  (ci.quantization or {}) != (result.base_quantization or {})):
        place_quantization(p, files, user, dict(ci.quantization or {}))
    return [], {}


def torch_script_change(result: RecommendResult, rec: Recommendation, files: dict[str, UserFile],
                        accelerate_path: str | None = None) -> str:
    """The training script's diff for a non-DeepSpeed configuration (``script_diff.torch_script_diff``):
    the launch line (with the accelerate config at ``accelerate_path``, else its name), how the
    model is loaded, and, without a TrainingArguments file, the plain loop's lines."""
    from memfit.core.recommend.script_diff import torch_script_diff

    user = result.user_inputs or rec.scenario_inputs
    base, cand, ci = result.base_candidate, rec.candidate, rec.scenario_inputs
    ta = files.get("training_args")
    mik = ta.raw.get("model_init_kwargs") if ta is not None else None
    load_in_file = isinstance(mik, dict) and any(mik.get(k) not in (None, "auto") for k in ("torch_dtype", "dtype"))
    ac = files.get("accelerate_config")

    def state(c, load, quant, accel):
        return {"framework": c.framework, "precision": c.precision, "optim": c.optim, "micro": c.micro_batch,
                "accum": c.grad_accum, "ckpt": c.gradient_checkpointing, "load_dtype": load or "fp32",
                "load_in_file": load_in_file, "quant": quant if quant and quant.get("method", "none") != "none" else None,
                "accelerate_config": accel}

    before = state(base, result.base_load_dtype, result.base_quantization, ac.path if ac else None)
    after = state(cand, ci.load_dtype, ci.quantization, (accelerate_path or ac.name) if ac else None)
    fc = ac.raw.get("fsdp_config") if ac is not None else None
    if isinstance(fc, dict) and "fsdp_activation_checkpointing" in fc:  # accelerate checkpoints, not the script
        before["ckpt"] = after["ckpt"] = False
    if "bnb_config" in files and before["quant"]:  # the script passes the user's file: it changes, not the script
        before["quant"] = after["quant"]
    return torch_script_diff(model_ref=user.model or "", peft=(user.peft_method or "full") not in ("full", "freeze"),
                             trainer=ta is not None, gpus=result.hardware.gpus_per_node, before=before, after=after)


def _same_file(a: str, b: str) -> bool:
    return Path(a).resolve() == Path(b).resolve()


def _nested(raw: object, key: tuple[str, ...]) -> object:
    for k in key:
        raw = raw.get(k) if isinstance(raw, dict) else None
    return raw


def recommendation_files(result: RecommendResult, rec: Recommendation, files: dict[str, UserFile],
                         folder: Path) -> tuple[tuple[WrittenFile, ...], ScenarioInputs, tuple[str, ...], str]:
    """The files of one configuration (not yet written), its scenario's inputs, notes and the
    script's diff."""
    user = result.user_inputs or rec.scenario_inputs
    p = Placement()
    if rec.deepspeed_json:
        written, names = _deepspeed_files(result, rec, files, p, user, folder)
        new_json = next((w.name for w in written if w.role == "deepspeed"), None)
        if new_json is not None and result.user_scenario is not None:
            from memfit.core.recommend.script_diff import script_diff

            original = files["deepspeed"].name if "deepspeed" in files else None
            rec = replace(rec, script_diff=script_diff(
                result.user_scenario, files["deepspeed"].raw if "deepspeed" in files else rec.deepspeed_json,
                result.base_candidate, rec.candidate, model_ref=user.model or result.user_scenario.model_ref,
                ds_name=original, new_ds_name=str(folder / new_json)))
    else:
        written, names = _torch_files(result, rec, files, p, user)
        if p.accelerate_config:
            rec = replace(rec, script_diff=torch_script_change(result, rec, files,
                                                               str(folder / files["accelerate_config"].name)))
    for role, key in (("training_args", ("deepspeed",)), ("accelerate_config", ("deepspeed_config", "deepspeed_config_file"))):
        changes = getattr(p, role)
        named = _nested(files[role].raw, key) if role in files else None
        if (changes and isinstance(named, str) and not any(k[:len(key)] == key or key[:len(k)] == k for k, _ in changes)
                and "deepspeed" in files and _same_file(relative_path(named, files[role].path), files["deepspeed"].path)):
            # the user's DeepSpeed JSON, unchanged: the written file names it absolute, found from any folder
            changes.append((key, str(Path(files["deepspeed"].path).resolve())))
        if changes:
            if role not in files:
                raise MemfitError(f"internal: a {role} change without the user's {role} file")
            written.append(edited(files[role], tuple(changes)))
            names[role] = files[role].name
    if p.bnb_config is not None:
        if "bnb_config" in files:
            f = files["bnb_config"]
            written.append(edited(f, mapping_changes(f.raw, p.bnb_config)))
            names["bnb_config"] = f.name
        else:
            written.append(new_file("bnb_config", "bnb_config.json", json.dumps(p.bnb_config, indent=2) + "\n"))
            names["bnb_config"] = "bnb_config.json"
    named = replace(user, name=f"{user.name or result.scenario_name} (recommendation {rec.rank})")
    inputs = scenario_inputs(named, p, file_names=names)
    return tuple(written), inputs, tuple(p.notes) + tuple(n for w in written for n in w.notes), rec.script_diff


def with_file_diffs(result: RecommendResult, folder: str = "DIR") -> RecommendResult:
    """Each recommendation with the diffs of the user's files it changes, as ``--out DIR`` would
    write them (``folder`` stands for the directory), so every output can show them."""
    files = read_user_files(result.user_inputs) if result.user_inputs is not None else {}
    recs = []
    for rec in result.recommendations:
        written, _, notes, _ = recommendation_files(result, rec, files, Path(folder) / f"rank{rec.rank}-{slug(rec.candidate)}")
        # the script's diff stays the search's (it opens the config by its own name); --out's names the folder
        recs.append(replace(rec, file_diffs=tuple((w.name, w.diff) for w in written if w.diff),
                            notes=rec.notes + tuple(n for n in notes if n not in rec.notes)))
    return replace(result, recommendations=tuple(recs))


# ----------------------------------------------------------------------------------- writing

def _write_new(path: Path, text: str) -> str:
    """Create ``path`` by memfit's one writer (``memfit.core.writing``): never over an existing entry
    (a dangling symlink too), never through a link."""
    from memfit.core.writing import write_file

    return str(write_file(path, text, what="--out", exists_hint=EXISTS_HINT))


def write_recommendations(result: RecommendResult, out_dir: str | Path) -> RecommendResult:
    """Write every configuration's folder into ``out_dir`` (created if needed); returns the result
    with each recommendation's ``files`` filled and a note where its scenario does not plan back to
    the figures shown. Refuses, writing nothing, if any target exists."""
    from memfit.core.recommend.scenario_file import scenario_document, scenario_yaml

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise MemfitError(f"--out {out} exists and is not a directory")
    files = read_user_files(result.user_inputs) if result.user_inputs is not None else {}
    plans = []
    for rec in result.recommendations:
        folder = out / f"rank{rec.rank}-{slug(rec.candidate)}"
        written, inputs, notes, script = recommendation_files(result, rec, files, folder)
        names = {w.name for w in written}
        doc = scenario_document(inputs, written=names)
        texts = [(w.name, w.text) for w in written] + [(f"{w.name}.diff", w.diff) for w in written if w.diff]
        if script:
            texts.append((SCRIPT_DIFF_NAME, script))
        texts.append((SCENARIO_NAME, scenario_yaml(doc, HEADER.format(rank=rec.rank, scenario=result.scenario_name,
                                                                     path=folder / SCENARIO_NAME))))
        plans.append((replace(rec, script_diff=script), folder, texts, notes))
    for _, folder, texts, _ in plans:
        for name, _ in texts:
            if (folder / name).exists() or (folder / name).is_symlink():
                raise MemfitError(f"{folder / name} exists; {EXISTS_HINT}")
    recs = []
    for rec, folder, texts, notes in plans:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise MemfitError(f"--out: cannot create directory {folder}: {e.strerror or type(e).__name__}") from None
        paths = tuple(_write_new(folder / name, text) for name, text in texts)
        diffs = tuple((name[:-5], text) for name, text in texts if name.endswith(".diff") and name != SCRIPT_DIFF_NAME)
        recs.append(replace(rec, files=paths, file_diffs=diffs,
                            notes=rec.notes + tuple(n for n in notes if n not in rec.notes)
                            + _replan(rec, folder / SCENARIO_NAME)))
    return replace(result, recommendations=tuple(recs))


def _replan(rec: Recommendation, scenario: Path) -> tuple[str, ...]:
    """Plan the written scenario as ``memfit plan`` would; a note if its verdict figures are not the
    ones recommend shows (``memfit.core.figures``)."""
    from memfit.core.figures import headline
    from memfit.core.plan import make_plan
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.read import read_scenario_file

    try:
        again = headline(make_plan(build_scenario(read_scenario_file(scenario))))
    except MemfitError as e:
        return (f"memfit bug: {scenario} does not plan ({e}); please report it",)
    shown = rec.headline
    if (again.gpu.bytes, again.host.bytes) != (shown.gpu.bytes, shown.host.bytes):
        return (f"memfit bug: {scenario} plans to {again.gpu.name} {again.gpu.bytes:,} B and {again.host.name} "
                f"{again.host.bytes:,} B, not the {shown.gpu.bytes:,} B and {shown.host.bytes:,} B shown; please report it",)
    return ()
