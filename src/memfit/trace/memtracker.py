"""torch's own ``MemTracker`` (``torch.distributed._tools.mem_tracker``) made usable on a PEFT model, as an
independent check of memfit's traces (tests/trace/test_activations_vs_memtracker.py,
benchmarks/bench_tracker_runs.py).

``MemTracker`` registers gradient hooks on every parameter and a frozen parameter refuses a hook;
``PeftMemTracker`` hooks the trainable ones only, with the same bookkeeping the tracker's own hooks do.
"""

from __future__ import annotations

from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType


class PeftMemTracker(MemTracker):
    """Gradient hooks on trainable parameters only."""

    def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
        out = super()._track_module_params_and_buffers(module, install_grad_hooks=False)
        if install_grad_hooks:
            for p in module.parameters():
                if p.requires_grad and self._param_to_grad_hook_handles.get(p) is None:
                    def on_grad(g):
                        self._update_and_maybe_create_winfos(g, _MemRefType.GRAD)
                    self._param_to_grad_hook_handles[p] = (
                        p.register_hook(on_grad), p.register_post_accumulate_grad_hook(lambda q: on_grad(q.grad)))
        return out
