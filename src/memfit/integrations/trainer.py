"""``MemfitCallback``: record a transformers ``Trainer`` (or TRL) run phase by phase for ``memfit compare``.

::

    from memfit.integrations import MemfitCallback

    cb = MemfitCallback("runs/rec1")          # create it before loading the model: "load" starts here
    model = AutoModelForCausalLM.from_pretrained(...)
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[cb])
    trainer.train()                           # files are written when training ends

Phases, from the Trainer's events (transformers/trainer.py: ``_inner_training_loop``) and two hooks
on the model:

- ``load``: from the callback's creation to ``on_init_end`` (the end of ``Trainer.__init__``);
- ``initialize`` when the Trainer runs DeepSpeed (``args.deepspeed``), else ``setup``: from there to
  ``on_train_begin`` (``_prepare_for_training``: wrapping, optimizer creation, ``deepspeed.initialize``);
- ``forward``: a forward pre-hook on the model (training mode, gradients on) to its forward hook;
- ``backward``: from the end of the forward (the loss) to the next forward or ``on_pre_optimizer_step``
  (so gradient clipping belongs to backward);
- ``optimizer_step``: ``on_pre_optimizer_step`` to ``on_step_end`` (the step, the scheduler, zero_grad);
- ``save``: from ``on_step_end`` when the Trainer is about to save to ``on_save``.

The recorder names them as ``memfit.record`` does (``accum.*``, ``step2.*``). Evaluation forwards
(no gradients) are not marked.
"""

from __future__ import annotations

import os

import functools


class _Recorder:
    """The callback's behaviour; ``MemfitCallback`` is this plus transformers' ``TrainerCallback``
    (no-op defaults for the events it does not handle), made on first use so that importing this
    module never imports transformers."""

    def __init__(self, output_dir: str | os.PathLike, *, snapshot: bool = False, max_entries: int | None = None,
                 device: str | None = None, overwrite: bool = False) -> None:
        from memfit.recording.recorder import DEFAULT_MAX_ENTRIES, Recorder

        max_entries = DEFAULT_MAX_ENTRIES if max_entries is None else max_entries

        self.recorder = Recorder(output_dir, snapshot=snapshot, max_entries=max_entries, device=device, overwrite=overwrite)
        self.recorder.start()
        self.recorder.mark("load")
        self._hooks: list = []
        self.files: list = []

    # Trainer events
    def on_init_end(self, args, state, control, **kwargs):
        if self.recorder.started and self.recorder.current and self.recorder.current["label"] == "load":
            self.recorder.mark("initialize" if getattr(args, "deepspeed", None) else "setup")
        return control

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.recorder.close_phase()
        if model is not None and not self._hooks:
            self._hooks = [model.register_forward_pre_hook(self._forward_start),
                           model.register_forward_hook(self._forward_end)]
        return control

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.recorder.mark("optimizer_step")
        return control

    def on_step_end(self, args, state, control, **kwargs):
        self.recorder.close_phase()
        if control.should_save:
            self.recorder.mark("save")
        return control

    def on_save(self, args, state, control, **kwargs):
        if self.recorder.current and self.recorder.current["label"] == "save":
            self.recorder.close_phase()
        return control

    def on_train_end(self, args, state, control, **kwargs):
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.files = self.recorder.finish()
        return control

    # model hooks
    def _training(self, module) -> bool:
        import torch

        return module.training and torch.is_grad_enabled() and self.recorder.started

    def _forward_start(self, module, args):
        if self._training(module):
            self.recorder.mark("forward")

    def _forward_end(self, module, args, output):
        if self._training(module) and self.recorder.current and self.recorder.current["label"] == "forward":
            self.recorder.mark("backward")


@functools.cache
def _callback_class() -> type:
    from transformers import TrainerCallback  # heavy: imported on first use of MemfitCallback only

    cls = type("MemfitCallback", (_Recorder, TrainerCallback),
               {"__doc__": "Records memory per phase into ``output_dir`` (see the module docstring).",
                "__module__": __name__})
    cls.__qualname__ = "MemfitCallback"
    return cls


def __getattr__(name: str):
    if name == "MemfitCallback":
        return _callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
