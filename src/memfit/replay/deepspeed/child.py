"""The DeepSpeed replay recipe (``ChildRun``), run in the child process that
``python -m memfit.replay.child SPEC.json OUT.json`` starts (``memfit.replay.child`` dispatches here).

Steps (phase names from ``memfit.core.ledger_types.PHASES``):

1. set the launcher environment (``DS_ACCELERATOR``, ``LOCAL_RANK``, ``RANK``, ``WORLD_SIZE``;
   under torchrun only ``DS_ACCELERATOR``: torchrun sets the rest), start the host tracker, create
   a one-process world of ``world_size`` ranks (``memfit.replay.fake_world``: torch's fake process
   group, sizes real, collective outputs mirrored) or join torchrun's real one, import deepspeed;
2. ``load``: build the model from config.json with random weights in the load dtype (under
   transformers' ``HfDeepSpeedConfig`` when ``zero_init``), apply the PEFT method;
3. ``initialize.*``: ``deepspeed.initialize(model=..., model_parameters=..., config=...)``, cut into
   sub-phases by ``memfit.replay.deepspeed.seams``; then read DeepSpeed's buffers (``attribution``);
4. ``forward``/``backward``/``optimizer_step`` per micro-step: ``engine(input_ids, labels=...)``,
   ``engine.backward(loss)``, ``engine.step()`` on random tokens; DeepSpeed's buffers and the
   optimizer state are read again after the first step the fp16 loss scaler did not skip (more
   steps are run, up to ``max_extra_steps``, if it skipped them all);
5. ``save``: ``engine.save_16bit_model`` (or the consolidated ZeRO-3 state dict, see
   ``ReplaySpec.save``).

Any exception is caught with the phase it happened in and recorded like a success.
"""

from __future__ import annotations

import copy
import math
import os
import shutil
import tempfile
import time
import traceback
from typing import Any

from memfit.replay.child_common import (
    MAX_TIMELINE_POINTS,
    _device_info,
    _fault_hook,
    _model_summary,
    _versions,
    classify,
    launcher_env,
    step_alloc_sequence,
)
from memfit.replay.measurement import Measurement, ModelSummary, ReplayError, TimelinePoint
from memfit.replay.spec import ReplaySpec
from memfit.replay.supervision import Terminated


def prepare_deepspeed_config(spec: ReplaySpec) -> tuple[dict[str, Any], list[str]]:
    """The JSON handed to ``deepspeed.initialize`` and the substitutions made.

    Batch sizes: ``train_micro_batch_size_per_gpu = micro_batch`` and ``train_batch_size =
    micro_batch x gradient_accumulation_steps x world_size`` (DeepSpeed checks this identity).
    Precision: a cpu replay of an fp16 config runs bf16, which has the same 2 bytes per element and
    the same default gradient accumulation dtype (the model dtype, ``get_data_types``). DeepSpeed's
    CPU accelerator refuses fp16 where oneDNN lacks it (``engine._do_sanity_check``) and accepts it
    on CPUs with avx512_fp16/AMX, where the fp16 kernels and DeepSpeed's fp16 path allocate other
    temporaries: always substituting keeps a recording independent of the CPU it was made on.
    """
    cfg = copy.deepcopy(dict(spec.deepspeed_config))
    notes: list[str] = []
    ga = cfg.get("gradient_accumulation_steps", 1)
    if not isinstance(ga, int) or ga < 1:
        ga = 1
        cfg["gradient_accumulation_steps"] = 1
    cfg["train_micro_batch_size_per_gpu"] = spec.micro_batch
    cfg["train_batch_size"] = spec.micro_batch * ga * spec.world_size
    fp16 = cfg.get("fp16") or {}
    if spec.accelerator == "cpu" and fp16.get("enabled") is True:
        cfg.pop("fp16")
        cfg["bf16"] = {"enabled": True}
        notes.append("fp16->bf16: cpu replays run bf16 (same 2 bytes per element)")
    return cfg, notes


def _preload_ops(ds_config: dict[str, Any]) -> None:
    """Load (JIT-building if needed) the optimizer op DeepSpeed will load for this config.

    Mirrors ``DeepSpeedEngine.get_optimizer_configuration``: Adam/AdamW with an offloaded optimizer
    uses DeepSpeedCPUAdam, otherwise FusedAdam (unless ``torch_adam``). A stale or long-held build
    lock raises ``BuildLockError`` (``memfit.replay.ops.load_op``); any other failure here is left
    for ``deepspeed.initialize`` to raise in its own phase.
    """
    from memfit.replay.ops import BuildLockError, load_op

    optimizer = ds_config.get("optimizer") or {}
    if str(optimizer.get("type", "")).lower() not in ("adam", "adamw") or (optimizer.get("params") or {}).get("torch_adam"):
        return
    zero = ds_config.get("zero_optimization") or {}
    offload = (zero.get("offload_optimizer") or {}).get("device", "none")
    try:
        load_op("cpu_adam" if offload in ("cpu", "nvme") else "fused_adam")
    except BuildLockError:
        raise
    except Exception:  # noqa: BLE001
        return


class ChildRun:
    """One replay inside the child process."""

    def __init__(self, spec: ReplaySpec, *, progress_path: str | None, command: str) -> None:
        self.spec = spec
        self.progress_path = progress_path
        self.command = command
        self.items: list = []
        self.notes: list[str] = []
        self.substitutions: list[str] = []
        self.model_summary: ModelSummary | None = None
        self.ds_config: dict[str, Any] = dict(spec.deepspeed_config)
        self.error: ReplayError | None = None
        self.losses: list[float | None] = []
        self.skipped_steps = 0

    def execute(self) -> Measurement:
        spec = self.spec
        wall0 = time.perf_counter()
        start_ns = time.time_ns()
        os.environ.update(launcher_env(spec))
        import torch

        from memfit.replay.host_tracker import HostTracker, downsample
        from memfit.replay.phases import CudaStats, PhaseRecorder

        if spec.threads:
            torch.set_num_threads(spec.threads)
        torch.manual_seed(spec.seed)
        # torchrun: rank r takes the GPU LOCAL_RANK (one host); the fake world has one GPU.
        index = int(os.environ.get("LOCAL_RANK", "0")) if spec.launcher == "torchrun" else 0
        if spec.accelerator == "cuda":
            torch.cuda.set_device(index)
            if spec.emulate_capacity_bytes:
                total = torch.cuda.mem_get_info(index)[1]
                torch.cuda.set_per_process_memory_fraction(min(1.0, spec.emulate_capacity_bytes / total), index)
        device = _device_info(spec, index)
        tracker = HostTracker(enabled=spec.host_tracker)
        recorder = PhaseRecorder(tracker=tracker, cuda=CudaStats() if spec.accelerator == "cuda" else None,
                                 progress_path=self.progress_path)
        recorder.hooks.append(_fault_hook(spec))
        tracker.start()
        try:
            self._run(recorder, tracker)
            recorder.close(completed=True)
        except Terminated:
            raise  # stopped from outside: no result, as if killed
        except BaseException as exc:  # noqa: BLE001 - every failure is a result
            phase = recorder.current_phase
            recorder.close(completed=False)
            kind = classify(exc)
            message = str(exc) if kind.startswith("build_lock") else f"{type(exc).__name__}: {exc}"
            self.error = ReplayError(phase=phase, kind=kind, message=message, traceback=traceback.format_exc())
        result = tracker.stop()
        phases = recorder.finish(result)
        timeline: tuple[TimelinePoint, ...] = ()
        if result is not None:
            names = recorder.window_names()
            if result.unmatched_pins:
                self.notes.append(f"{result.unmatched_pins} pin events matched no tracked host allocation")
            timeline = tuple(
                TimelinePoint(t_s=round((s.t_ns - start_ns) / 1e9, 6), phase=names.get(s.window, "setup"),
                              host_live_bytes=s.host_live_bytes, host_pinned_bytes=s.host_pinned_bytes,
                              device_allocated_bytes=s.device_live_bytes if spec.accelerator == "cuda" else None)
                for s in downsample(result.samples, MAX_TIMELINE_POINTS)
            )
        return Measurement(
            spec=spec, deepspeed_config_used=self.ds_config, substitutions=tuple(self.substitutions),
            device=device, versions=_versions(), command=self.command, model=self.model_summary,
            phases=phases, attributed=tuple(self.items), timeline=timeline, losses=tuple(self.losses),
            skipped_steps=self.skipped_steps, error=self.error,
            wall_s=round(time.perf_counter() - wall0, 3), notes=tuple(self.notes),
            alloc_sequence=step_alloc_sequence(spec, recorder, tracker),
        )

    def _run(self, recorder, tracker) -> None:
        spec = self.spec
        import torch

        from memfit.replay.fake_world import join_fake_world, join_real_world

        if spec.launcher == "torchrun":
            rank, backend = join_real_world(world_size=spec.world_size)
            if rank != spec.rank:
                raise RuntimeError(f"process group rank {rank} differs from the launcher's RANK {spec.rank}")
            self.notes.append(f"real world: rank {rank} of {spec.world_size} processes, backend {backend}")
        else:
            join_fake_world(rank=spec.rank, world_size=spec.world_size)
        import deepspeed
        from deepspeed.accelerator import get_accelerator

        from memfit.replay.deepspeed.attribution import PinRegistry, model_items, read_items
        from memfit.replay.model_build import apply_peft, build_config, build_model
        from memfit.replay.deepspeed.seams import initialize_phases, record_pins

        accel = get_accelerator()
        self.ds_config, self.substitutions = prepare_deepspeed_config(spec)
        load_dtype = spec.load_dtype
        if self.substitutions and load_dtype == "fp16":
            load_dtype = "bf16"
            self.substitutions.append("load dtype fp16->bf16 (follows the precision substitution)")
        model_config = spec.effective_model_config()
        # Import and JIT-load everything before the first phase, so import-time allocations and
        # op loading (seconds for cpu_adam) stay out of the phases.
        import peft  # noqa: F401
        import transformers  # noqa: F401

        _preload_ops(self.ds_config)

        pins = PinRegistry()

        def note_pinned(tensor) -> None:
            tracker.note_pinned(tensor)
            pins.add(tensor)

        with record_pins(note_pinned):
            recorder.enter("load")
            hf_ds_config = None
            if spec.zero_init:
                from transformers.integrations import HfDeepSpeedConfig

                hf_ds_config = HfDeepSpeedConfig(self.ds_config)  # noqa: F841 - must stay alive
            model = build_model(model_config, dtype=load_dtype, attention=spec.attention)
            model = apply_peft(model, spec.peft)
            if spec.gradient_checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            self.model_summary = _model_summary(model, build_config(model_config, attention=spec.attention))
            self.items.extend(model_items(model, at="load", pins=pins, ds_config=self.ds_config))
            if spec.model_parameters == "trainable":
                params = [p for p in model.parameters() if p.requires_grad]
            else:
                params = list(model.parameters())

            with initialize_phases(recorder, zero_stage=spec.zero_stage):
                engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=self.ds_config)
            del params
            self.items.extend(read_items(engine, at="initialize", pins=pins))
            from memfit.replay.deepspeed.coordinator_log import maybe_install

            coordinator_log = maybe_install(model) if spec.zero_stage == 3 else None  # MEMFIT_COORDINATOR_LOG

            engine.train()
            device = accel.current_device_name()
            vocab = int(model_config.get("vocab_size") or 1000)
            gen = torch.Generator().manual_seed(spec.seed)
            ga = engine.gradient_accumulation_steps()
            step = 0
            step_items_read = False
            while step < spec.steps or (0 < step == self.skipped_steps and step < spec.steps + spec.max_extra_steps):
                if step == spec.steps:
                    self.notes.append(f"every step so far was skipped by the fp16 loss scaler; ran step {step}")
                for micro in range(ga):
                    recorder.enter("forward", step=step, micro_step=micro)
                    ids = torch.randint(0, vocab, (spec.micro_batch, spec.seq_len), generator=gen).to(device)
                    loss = engine(input_ids=ids, labels=ids).loss
                    value = float(loss.detach().float().cpu())
                    self.losses.append(value if math.isfinite(value) else None)
                    recorder.enter("backward", step=step, micro_step=micro)
                    engine.backward(loss)
                    del loss, ids
                    recorder.enter("optimizer_step", step=step, micro_step=micro)
                    engine.step()
                    self.skipped_steps = int(getattr(engine, "skipped_steps", 0))
                step += 1
                if not step_items_read and step > self.skipped_steps:
                    self.items.extend(read_items(engine, at="step", pins=pins))
                    step_items_read = True
            if not step_items_read and step:
                self.items.extend(read_items(engine, at="step", pins=pins))
            if coordinator_log is not None:
                coordinator_log.close()
            self._save(engine, recorder)

    def _save(self, engine, recorder) -> None:
        spec = self.spec
        mode = spec.save
        gather = bool(engine.zero_gather_16bit_weights_on_model_save()) if spec.zero_stage == 3 else True
        if mode == "never" or (mode == "auto" and not gather):
            if mode == "auto":
                self.notes.append("no save phase: ZeRO-3 without stage3_gather_16bit_weights_on_model_save")
            return
        recorder.enter("save")
        try:
            if mode == "consolidate":
                state = engine._zero3_consolidated_16bit_state_dict()
                del state
                return
            out_dir = tempfile.mkdtemp(prefix="memfit-replay-save-")
            try:
                saved = engine.save_16bit_model(out_dir)
                if saved is False:
                    self.notes.append("save_16bit_model returned False (nothing saved)")
            finally:
                shutil.rmtree(out_dir, ignore_errors=True)
        finally:
            collect_save_cycle()


def collect_save_cycle() -> None:
    """Free the consolidated 16-bit state dict that a reference cycle keeps after the save.

    ``DeepSpeedEngine._zero3_consolidated_16bit_state_dict`` (deepspeed 0.19.8,
    runtime/engine.py) fills ``state_dict`` from the nested ``get_layer_state_dict``, which calls
    itself: the function's closure holds a cell that points back at the function, and another that
    holds ``state_dict``. The dict, and every gathered storage in it, is therefore freed only when
    Python's cyclic collector next reaches the generation that cycle is in, not when
    ``save_16bit_model`` returns. When that happens depends on how many Python objects the process
    allocated since the last collection, so two processes running the same code (the fake world
    and a torchrun rank) end the save at different live bytes: measured on rank 0 of the seed-like
    case, 1 389 648 B (the whole consolidated dict) still live in one world and freed in the other,
    varying between runs. The replay collects once at the end of the save so that the phase ends
    where the ledger ends it (the dict freed); the save's peak is not affected (the dict is fully
    alive at its peak either way). A real process keeps the dict until the next collection.
    """
    import gc

    gc.collect()

