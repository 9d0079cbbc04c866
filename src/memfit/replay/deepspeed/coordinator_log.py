"""Log DeepSpeed's ZeRO-3 parameter coordinator at every fetch and release, inside a replay.

Enabled in the replay child when the environment variable ``MEMFIT_COORDINATOR_LOG`` names a
file: ``install`` wraps ``PartitionedParameterCoordinator.fetch_sub_module``,
``release_sub_module`` and ``reset_step`` (deepspeed/runtime/zero/partitioned_param_coordinator.py,
0.19.8) and records, after each call, the coordinator's own counters: ``__n_available_params``
(elements), the params in its in-flight registry, the bytes of gathered param data (every param not
NOT_AVAILABLE: the storage ``param.data`` holds, persistent ones apart) and the bytes of the coalesced all-gather buffers still held by in-flight handles. ``close``
writes the log as JSON, with each module's own parameters (name, ``ds_numel``, ``ds_persist``,
element size), so ``memfit.core.ledger.deepspeed.zero3_fetch`` can be replayed over the exact order the real
run took (tests/replay/test_coordinator_vs_replay.py).
"""

from __future__ import annotations

import json
import os
from typing import Any

ENV = "MEMFIT_COORDINATOR_LOG"


def _handle_flat_storages(handle: Any, out: dict[int, int]) -> None:
    """Storages of the flat buffers an all-gather handle holds (views of ``flat_tensor``)."""
    inner = getattr(handle, "handles", None)
    if inner is not None:  # MultipleAllGatherHandles
        for h in inner:
            _handle_flat_storages(h, out)
        return
    parts = getattr(handle, "partitions", None)
    if parts:
        st = parts[0].untyped_storage()
        out[st.data_ptr()] = st.nbytes()


class CoordinatorLog:
    """The records of one replay (see the module docstring)."""

    def __init__(self, model: Any, path: str) -> None:
        self.path = path
        self.names = {id(m): n for n, m in model.named_modules()}
        self.modules: dict[str, list[list]] = {}
        self.externals: dict[str, list[str]] = {}
        self.records: list[dict] = []
        self.passes = 0
        self._saved: list[tuple[Any, str, Any]] = []

    def _read(self, co: Any, kind: str, module: Any, forward: bool) -> None:
        reg = co._PartitionedParameterCoordinator__inflight_param_registry
        flats: dict[int, int] = {}
        for handle in reg.values():
            _handle_flat_storages(handle, flats)
        rec = {"pass": self.passes, "kind": kind, "module": self.names.get(id(module), "?"), "forward": forward,
               "n_available": int(co._PartitionedParameterCoordinator__n_available_params),
               "inflight_numel": sum(int(p.ds_numel) for p in reg), "flat_bytes": sum(flats.values())}
        numel = nbytes = persist_bytes = 0
        for p in self._root.parameters():  # AVAILABLE, or INFLIGHT with its own buffer (sequential gather)
            if getattr(p, "ds_status", None) is None or p.ds_status.name == "NOT_AVAILABLE":
                continue
            b = p.data.untyped_storage().nbytes()
            if p.ds_persist:
                persist_bytes += b
            else:
                numel += int(p.ds_numel)
                nbytes += b
        rec.update(gathered_numel=numel, gathered_bytes=nbytes, persistent_bytes=persist_bytes)
        self.records.append(rec)

    def install(self) -> None:
        from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator as C

        log = self
        fetch, release, reset = C.fetch_sub_module, C.release_sub_module, C.reset_step

        def fetch_sub_module(co, current_submodule, forward):
            out = fetch(co, current_submodule, forward)
            log._read(co, "fetch", current_submodule, bool(forward))
            return out

        def release_sub_module(co, submodule, forward=False):
            out = release(co, submodule, forward)
            log._read(co, "release", submodule, bool(forward))
            return out

        def reset_step(co):
            out = reset(co)
            log.passes += 1
            return out

        for name, fn in (("fetch_sub_module", fetch_sub_module), ("release_sub_module", release_sub_module),
                         ("reset_step", reset_step)):
            self._saved.append((C, name, getattr(C, name)))
            setattr(C, name, fn)

    def attach(self, model: Any) -> None:
        self._root = model

    def _describe_modules(self) -> None:
        """Each module's own params and the external params DeepSpeed registered on it (a param
        another module's forward read: ``parameter_offload.py:ZeROOrderedDict.__getitem__``)."""
        pname = {id(p): n for n, p in self._root.named_parameters()}
        for n, m in self._root.named_modules():
            self.modules[n] = [[pn if not n else f"{n}.{pn}", int(getattr(p, "ds_numel", p.numel())),
                                bool(getattr(p, "ds_persist", False)), p.element_size()]
                               for pn, p in m.named_parameters(recurse=False)]
            ext = getattr(m, "ds_external_parameters", None)
            if callable(ext):
                names = [pname.get(id(p), "?") for _, p in ext()]
                if names:
                    self.externals[n] = names

    def close(self) -> None:
        for cls, name, fn in self._saved:
            setattr(cls, name, fn)
        self._saved = []
        self._describe_modules()
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"modules": self.modules, "externals": self.externals, "records": self.records}, fh)
        os.replace(tmp, self.path)


def maybe_install(model: Any) -> CoordinatorLog | None:
    """``install`` when ``MEMFIT_COORDINATOR_LOG`` is set (the replay child calls this)."""
    path = os.environ.get(ENV)
    if not path:
        return None
    log = CoordinatorLog(model, path)
    log.attach(model)
    log.install()
    return log


# ---------------------------------------------------------------------------------- fixtures
FIXTURE_DIR = os.path.join("tests", "fixtures", "coordinator")


def fixture_cases() -> dict:
    """The recorded cases: tight ZeRO-3 limits so that prefetch, ``max_live_parameters``, the reuse
    distance, persistence and coalesced all-gathers all decide something (tiny Llama shapes), and
    the seed's prefix tuning on GPT-J with its loose limits."""
    from memfit.core.peft.spec import PeftSpec
    from memfit.replay.deepspeed.record_fixtures import LORA, SEED_PREFIX, TINY_GPTJ, TINY_LLAMA, deepspeed_json
    from memfit.replay.spec import ReplaySpec

    def ds(offload: bool, **limits: int) -> dict:
        cfg = deepspeed_json(3, offload=offload, gather_on_save=False)
        cfg["zero_optimization"].update(limits)
        return cfg

    lora = ds(False, stage3_prefetch_bucket_size=20000, stage3_max_live_parameters=60000,
              stage3_max_reuse_distance=30000, stage3_param_persistence_threshold=600)
    full = ds(True, stage3_prefetch_bucket_size=50000, stage3_max_live_parameters=150000,
              stage3_max_reuse_distance=80000, stage3_param_persistence_threshold=200)
    prefix = ds(False, stage3_prefetch_bucket_size=50000, stage3_param_persistence_threshold=1000)
    return {c.name: c for c in (
        # prefix tuning, the seed's method, with max_live_parameters and max_reuse_distance at 1e9:
        # step 2 keeps every param its backward uses, and only those
        ReplaySpec(name="gptj_prefix_z3_fetch_w2", model_config=TINY_GPTJ, layers=2, peft=SEED_PREFIX,
                   deepspeed_config=prefix, world_size=2, seq_len=16, steps=2, threads=1, save="never"),
        ReplaySpec(name="llama_lora_z3_fetch_w2", model_config=TINY_LLAMA, layers=3, peft=LORA, deepspeed_config=lora,
                   world_size=2, seq_len=16, steps=2, threads=1, save="never"),
        ReplaySpec(name="llama_full_z3_offload_gc_fetch_w4", model_config=TINY_LLAMA, layers=3, peft=PeftSpec(),
                   deepspeed_config=full, world_size=4, seq_len=16, steps=2, threads=1, save="never",
                   gradient_checkpointing=True),
    )}


def record(out_dir: str = FIXTURE_DIR, only: list[str] | None = None) -> None:
    """Run each case with the log on; save ``<case>.measurement.json`` and ``<case>.log.json``."""
    from memfit.replay.measurement import save_fixture
    from memfit.replay.runner import run_replay

    os.makedirs(out_dir, exist_ok=True)
    for name, spec in fixture_cases().items():
        if only and name not in only:
            continue
        log_path = os.path.join(out_dir, f"{name}.log.json")
        m = run_replay(spec, env={ENV: os.path.abspath(log_path)}, timeout_s=1800)
        if not m.ok:
            raise SystemExit(f"{name}: replay failed: {m.error}")
        save_fixture(m, os.path.join(out_dir, f"{name}.measurement.json"), overwrite=True)
        print(f"{name}: {m.wall_s:.0f} s")


if __name__ == "__main__":
    import sys

    record(only=sys.argv[1:] or None)
