"""The replay recipe outside DeepSpeed (``spec.framework`` torch, ddp, fsdp, fsdp2): a plain PyTorch
training loop doing what the Hugging Face Trainer does, measured phase by phase.

Run by ``python -m memfit.replay.child`` (which dispatches here) under the same supervisor
(``memfit.replay.runner``), host tracker and phase recorder as the DeepSpeed replays. Phases
(``memfit.core.ledger_types.TORCH_PHASES``):

1. ``load``: the model built from config.json with random weights in the load dtype
   (``from_config``), quantized with bitsandbytes when the spec says so (``memfit.replay.pytorch.quantize``:
   the same modules and ``Params4bit``/``Int8Params`` calls transformers' loader makes),
   ``prepare_model_for_kbit_training``, the PEFT method (peft), gradient checkpointing.
2. ``setup``: the precision cast of pure 16-bit modes (per param), DDP/FSDP wrapping, the
   optimizer exactly as the Trainer builds it (``Trainer.get_optimizer_cls_and_kwargs`` with its
   two weight-decay param groups), a ``GradScaler`` for fp16 autocast.
3. per micro-step: ``forward`` (under ``torch.autocast`` for the AMP modes), ``backward``
   (``scaler.scale(loss).backward()``); per step: ``optimizer_step`` (``unscale_``,
   ``clip_grad_norm_``, ``step``, ``update``, ``zero_grad(set_to_none=True)``). Step 1's first
   micro-step is ``forward``/``backward``, its later ones ``accum.*``; every micro-step of the later
   steps is ``step2.*`` (the phase's peak is the worst of them).
4. with ``spec.evaluation``: ``eval.forward`` and ``eval.generate``, the real ``Seq2SeqTrainer.evaluate()``
   (``memfit.replay.pytorch.evaluation``);
5. ``save``: ``save_pretrained`` (a PEFT model saves its adapter).

Sizes read off the objects (``AttributedItem`` keys): ``model.params`` (after load; the params that
are not bitsandbytes-quantized), ``torch.grads``
(after the first backward of step 1: every ``.grad`` storage once), ``optimizer.state.total`` (after
the first step: every optimizer state tensor once), ``quant.weights`` (the quantized weights' packed
data and quant-state tensors), ``ddp.buckets`` (DDP's reducer buckets: at ``setup`` as built, at
``step`` as rebuilt after the first synced backward).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
import time
import traceback
from typing import Any

from memfit.replay.measurement import AttributedItem, Measurement, ReplayError, TimelinePoint
from memfit.replay.spec import ReplaySpec
from memfit.replay.pytorch.attribution import _item, optimizer_state_tensors, quant_tensors


class TorchChildRun:
    """One non-DeepSpeed replay inside the child process (mirrors ``memfit.replay.deepspeed.child.ChildRun``)."""

    def __init__(self, spec: ReplaySpec, *, progress_path: str | None, command: str) -> None:
        self.spec = spec
        self.progress_path = progress_path
        self.command = command
        self.items: list[AttributedItem] = []
        self.notes: list[str] = []
        self.model_summary = None
        self.losses: list[float | None] = []

    def execute(self) -> Measurement:
        from memfit.replay.child_common import (MAX_TIMELINE_POINTS, _device_info, _fault_hook, _versions, classify,
                                                launcher_env, step_alloc_sequence)

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
        device = _device_info(spec)
        tracker = HostTracker(enabled=spec.host_tracker)
        recorder = PhaseRecorder(tracker=tracker, cuda=CudaStats() if spec.accelerator == "cuda" else None,
                                 progress_path=self.progress_path)
        recorder.hooks.append(_fault_hook(spec))
        error = None
        tracker.start()
        try:
            self._run(recorder)
            recorder.close(completed=True)
        except BaseException as exc:  # noqa: BLE001 - every failure is a result
            phase = recorder.current_phase
            recorder.close(completed=False)
            error = ReplayError(phase=phase, kind=classify(exc), message=f"{type(exc).__name__}: {exc}",
                                traceback=traceback.format_exc())
        result = tracker.stop()
        phases = recorder.finish(result)
        timeline: tuple[TimelinePoint, ...] = ()
        if result is not None:
            names = recorder.window_names()
            timeline = tuple(
                TimelinePoint(t_s=round((s.t_ns - start_ns) / 1e9, 6), phase=names.get(s.window, "setup"),
                              host_live_bytes=s.host_live_bytes, host_pinned_bytes=s.host_pinned_bytes,
                              device_allocated_bytes=s.device_live_bytes if spec.accelerator == "cuda" else None)
                for s in downsample(result.samples, MAX_TIMELINE_POINTS))
        return Measurement(
            spec=spec, deepspeed_config_used={}, substitutions=(), device=device, versions=_versions(),
            command=self.command, model=self.model_summary, phases=phases, attributed=tuple(self.items),
            timeline=timeline, losses=tuple(self.losses), skipped_steps=0, error=error,
            wall_s=round(time.perf_counter() - wall0, 3), notes=tuple(self.notes),
            alloc_sequence=step_alloc_sequence(spec, recorder, tracker))

    # -----------------------------------------------------------------------------------------
    def _run(self, recorder) -> None:
        spec = self.spec
        import torch

        from memfit.core.frameworks.pytorch import QuantSettings, TorchSettings
        from memfit.replay.child_common import _model_summary
        from memfit.replay.model_build import apply_peft, build_config, build_model, torch_dtype

        ts = TorchSettings(**spec.training)
        q = QuantSettings(**spec.quantization) if spec.quantization else QuantSettings()
        world = None
        if spec.framework in ("ddp", "fsdp", "fsdp2"):
            world = self._join_world()
        import peft  # noqa: F401 - imported before the first phase
        import transformers  # noqa: F401

        model_config = spec.effective_model_config()
        dev = torch.device("cuda", torch.cuda.current_device()) if spec.accelerator == "cuda" else torch.device("cpu")

        # ---- load
        recorder.enter("load")
        if q.enabled:
            from memfit.replay.pytorch.quantize import build_quantized_model

            model = build_quantized_model(model_config, load_dtype=spec.load_dtype, quant=q, attention=spec.attention,
                                          device=dev)
            if q.prepare_kbit:
                from peft import prepare_model_for_kbit_training

                model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        else:
            model = build_model(model_config, dtype=spec.load_dtype, attention=spec.attention)
        model = apply_peft(model, spec.peft)
        if spec.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model_summary = _model_summary(model, build_config(model_config, attention=spec.attention))
        self.items.append(_item("model.params", "load", [p for p in model.parameters()
                                                         if type(p).__name__ not in ("Params4bit", "Int8Params")]))
        if q.enabled:
            self.items.append(_item("quant.weights", "load", quant_tensors(model)))

        # ---- setup
        recorder.enter("setup")
        model = self._cast_and_move(model, ts, q, dev)
        model.train()
        wrapped = self._wrap(model, world)
        opt = self._optimizer(model, wrapped, ts)
        scaler = None
        if ts.precision == "amp_fp16":
            scaler = torch.amp.GradScaler(dev.type)
        autocast_dtype = {"amp_fp16": torch.float16, "amp_bf16": torch.bfloat16}.get(ts.precision)
        if wrapped is not model:
            self._after_wrap(wrapped)

        # ---- steps
        vocab = int(model_config.get("vocab_size") or 1000)
        gen = torch.Generator().manual_seed(spec.seed)
        ga = ts.gradient_accumulation_steps
        for step in range(spec.steps):
            for micro in range(ga):
                if step == 0:
                    fwd, bwd = ("forward", "backward") if micro == 0 else ("accum.forward", "accum.backward")
                else:
                    fwd, bwd = "step2.forward", "step2.backward"
                recorder.enter(fwd, step=step, micro_step=micro)
                ids = torch.randint(0, vocab, (spec.micro_batch, spec.seq_len), generator=gen).to(dev)
                sync = contextlib.nullcontext()
                if spec.framework == "ddp" and micro < ga - 1:
                    sync = wrapped.no_sync()  # the Trainer's accelerator.accumulate: no all-reduce before the last
                sync.__enter__()
                if autocast_dtype is not None:
                    with torch.autocast(dev.type, dtype=autocast_dtype):
                        loss = wrapped(input_ids=ids, labels=ids).loss
                else:
                    loss = wrapped(input_ids=ids, labels=ids).loss
                value = float(loss.detach().float().cpu())
                self.losses.append(value if math.isfinite(value) else None)
                recorder.enter(bwd, step=step, micro_step=micro)
                if ga > 1:
                    loss = loss / ga
                (scaler.scale(loss) if scaler is not None else loss).backward()
                sync.__exit__(None, None, None)
                del loss, ids
                if step == 0 and micro == 0:
                    # .grad tensors of their own (under gradient_as_bucket_view they are views into
                    # DDP's buckets, which the ddp.buckets item counts)
                    if spec.framework not in ("fsdp", "fsdp2"):
                        self.items.append(_item("torch.grads", "backward", [
                            p.grad for p in model.parameters() if p.grad is not None and not p.grad._is_view()]))
                    else:
                        self.items.append(_item("fsdp.sharded_grads", "backward",
                                                [p.grad for p in wrapped.parameters() if p.grad is not None]))
            recorder.enter("optimizer_step" if step == 0 else "step2.optimizer_step", step=step, micro_step=ga - 1)
            if scaler is not None:
                scaler.unscale_(opt)
            if ts.max_grad_norm:
                self._clip(wrapped, ts.max_grad_norm)
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            if step == 0:
                self.items.append(_item("optimizer.state.total", "step", optimizer_state_tensors(opt)))
            if step == 1 and spec.framework == "ddp":
                from memfit.replay.pytorch.ddp import bucket_bytes

                rebuilt = bucket_bytes(wrapped, "rebuilt_bucket_sizes") or bucket_bytes(wrapped, "bucket_sizes")
                self.items.append(AttributedItem(key="ddp.buckets", at="step", bytes=rebuilt, count=0, device="cpu"))
            wrapped.zero_grad(set_to_none=True)
        # ---- evaluation (framework torch: the Trainer's own evaluate())
        if spec.evaluation and spec.evaluation.get("strategy", "no") != "no":
            from memfit.replay.pytorch.evaluation import run_evaluation

            run_evaluation(recorder, model, spec, vocab=vocab, device=dev)
        # ---- save
        if spec.save != "never":
            recorder.enter("save")
            if spec.framework in ("fsdp", "fsdp2"):
                self._fsdp_state_dict(wrapped)
            else:
                self._save(model)

    def _join_world(self):
        from memfit.replay.pytorch.ddp import join_world

        rank, backend = join_world(self.spec)
        self.notes.append(f"rank {rank} of {self.spec.world_size}, backend {backend}")
        return rank

    def _cast_and_move(self, model, ts, q, dev):
        """Pure 16-bit modes: each non-PEFT, non-quantized param cast where it is (what
        ``from_pretrained(torch_dtype=...)`` gives; ``model.to(dtype)`` would cast the adapters and the
        floating buffers too); then the Trainer's ``model.to(device)`` (not for a model loaded onto
        its device, and a no-op on the CPU)."""
        import torch

        from memfit.core.ledger.context import is_adapter_param
        from memfit.replay.model_build import torch_dtype

        if ts.precision in ("fp16", "bf16"):
            target = torch_dtype(ts.precision)
            for name, p in model.named_parameters():
                if p.is_floating_point() and p.dtype != target and not is_adapter_param(name) \
                        and type(p).__name__ not in ("Params4bit", "Int8Params"):
                    p.data = p.data.to(target)
        if dev.type != "cpu" and not q.enabled:
            model = model.to(dev)
        return model

    def _wrap(self, model, world):
        spec = self.spec
        if spec.framework == "ddp":
            from memfit.replay.pytorch.ddp import wrap_ddp

            return wrap_ddp(model, spec, self.items)
        if spec.framework in ("fsdp", "fsdp2"):
            from memfit.replay.pytorch.fsdp import wrap_fsdp

            return wrap_fsdp(model, spec, self.items)
        return model

    def _after_wrap(self, wrapped) -> None:
        pass

    def _optimizer(self, model, wrapped, ts):
        """The Trainer's optimizer: ``get_optimizer_cls_and_kwargs`` and its two param groups."""
        from transformers import Trainer, TrainingArguments

        optim = ts.optim
        params = list(wrapped.named_parameters())
        if optim in ("adamw_torch_foreach", "adamw_torch_single"):
            import torch

            groups = self._groups(params, ts, model)
            return torch.optim.AdamW(groups, foreach=optim == "adamw_torch_foreach")
        optim_args = ",".join(f"{k}={v}" for k, v in (("momentum", ts.momentum if ts.momentum else None),
                                                       ("beta1", ts.beta1)) if v is not None)
        targs = TrainingArguments(output_dir=tempfile.gettempdir(), optim=optim, report_to=[],
                                  use_cpu=self.spec.accelerator == "cpu", weight_decay=ts.weight_decay,
                                  optim_args=optim_args or None)
        cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(targs)
        if optim == "adafactor" and ts.beta1 is not None:
            kwargs["beta1"] = ts.beta1
        return cls(self._groups(params, ts, model), **kwargs)

    def _groups(self, named, ts, model) -> list[dict[str, Any]]:
        from transformers import Trainer

        if not ts.trainer_param_groups:
            return [{"params": [p for _, p in named if p.requires_grad]}]
        decay = set(Trainer.get_decay_parameter_names(None, model))
        strip = ("module.", "_fsdp_wrapped_module.", "_orig_mod.")

        def plain(n: str) -> str:
            for s in strip:
                n = n.replace(s, "")
            return n

        groups = [
            {"params": [p for n, p in named if plain(n) in decay and p.requires_grad], "weight_decay": ts.weight_decay},
            {"params": [p for n, p in named if plain(n) not in decay and p.requires_grad], "weight_decay": 0.0},
        ]
        return [g for g in groups if g["params"]]

    def _clip(self, wrapped, max_norm: float) -> None:
        import torch

        if hasattr(wrapped, "clip_grad_norm_") and self.spec.framework == "fsdp":
            wrapped.clip_grad_norm_(max_norm)
        else:
            torch.nn.utils.clip_grad_norm_(wrapped.parameters(), max_norm)

    def _fsdp_state_dict(self, wrapped) -> None:
        """What accelerate's ``get_state_dict`` does for FSDP: the full state dict on rank 0's host."""
        if self.spec.framework == "fsdp":
            from torch.distributed.fsdp import FullStateDictConfig, StateDictType
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            # rank0_only=False: every rank builds what rank 0 builds (rank0_only crashes torch's fake
            # process group); the measured rank holds the same bytes either way
            with FSDP.state_dict_type(wrapped, StateDictType.FULL_STATE_DICT,
                                      FullStateDictConfig(offload_to_cpu=True, rank0_only=False)):
                state = wrapped.state_dict()
        else:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            state = get_model_state_dict(wrapped, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        del state

    def _save(self, model) -> None:
        rank = int(os.environ.get("RANK", "0"))
        out = tempfile.mkdtemp(prefix="memfit-replay-save-")
        try:
            if rank == 0:
                model.save_pretrained(out)
        finally:
            shutil.rmtree(out, ignore_errors=True)
