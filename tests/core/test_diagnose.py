"""``memfit diagnose``'s core: parsing logs and reconciling them with a plan (frames to phases: test_diagnose_rules.py).

Expected figures are the ones printed in the logs, converted by the test itself (GiB = 2**30); the
fixtures' frames are checked against the DeepSpeed and torch sources they name; reconciliation is
checked against ``make_plan``'s own ledger for the seed scenario.
"""

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import FrozenInstanceError, replace
from pathlib import Path

import pytest

from conftest import FIXTURES, SEED
from memfit.core.diagnose import (EventKind, diagnose_log, parse_log,
                                  parse_size, read_log)
from memfit.core.ledger_types import Device
from memfit.errors import MemfitError

LOGS = FIXTURES / "logs"
GiB, MiB = 2**30, 2**20


def gib(x: float) -> int:
    return round(x * GiB)


def mib(x: float) -> int:
    return round(x * MiB)


def read(name: str) -> str:
    return (LOGS / name).read_text()


@pytest.fixture(scope="module")
def seed():
    from memfit.core.plan import make_plan
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.read import read_scenario_file

    sc = build_scenario(read_scenario_file(SEED))
    return sc, make_plan(sc)


# ------------------------------------------------------------------------------------ the figures

def test_parse_size_units_and_precision():
    assert parse_size("1.88", "GiB") == (round(1.88 * 2**30), 2**30 // 200)
    assert parse_size("473.63", "MiB") == (round(473.63 * 2**20), 2**20 // 200)
    assert parse_size("896.00", "KiB") == (896 * 1024, 1024 // 200)
    assert parse_size("0", "bytes") == (0, 0)
    assert parse_size("64", "GB") == (64 * 10**9, 10**9 // 2)


def test_torch1_message_from_the_brief():
    text = ("RuntimeError: CUDA out of memory. Tried to allocate 1.88 GiB (GPU 0; 23.69 GiB total capacity; "
            "20.10 GiB already allocated; 1.12 GiB free; 21.50 GiB reserved in total by PyTorch)")
    (ev,) = parse_log(text).events
    n = ev.numbers
    assert ev.kind == EventKind.GPU_OOM and ev.gpu_index == 0
    assert (n.tried_to_allocate_bytes, n.total_capacity_bytes, n.allocated_bytes, n.free_bytes, n.reserved_bytes) == (
        gib(1.88), gib(23.69), gib(20.10), gib(1.12), gib(21.50))
    assert n.reserved_unallocated_bytes == gib(21.50) - gib(20.10)
    assert n.outside_allocator_bytes == gib(23.69) - gib(1.12) - gib(21.50)
    assert n.form == "torch 1.x"


def test_torch2_message_from_the_brief():
    text = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of "
            "23.69 GiB of which 1.06 MiB is free. Including non-PyTorch memory, this process has 23.67 GiB memory in "
            "use. Of the allocated memory 22.91 GiB is allocated by PyTorch, and 473.63 MiB is reserved by PyTorch "
            "but unallocated.")
    (ev,) = parse_log(text).events
    n = ev.numbers
    assert (n.tried_to_allocate_bytes, n.total_capacity_bytes, n.free_bytes, n.process_in_use_bytes,
            n.allocated_bytes, n.reserved_unallocated_bytes) == (
        mib(2), gib(23.69), mib(1.06), gib(23.67), gib(22.91), mib(473.63))
    assert n.reserved_bytes == gib(22.91) + mib(473.63)
    assert n.form == "torch 2.x" and ev.gpu_index == 0


def test_torch2_wrapped_with_processes_and_private_pools():
    text = """Traceback (most recent call last):
  File "run.py", line 3, in <module>
    x = torch.empty(n, device="cuda:1")
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 304.00 MiB.
GPU 1 has a total capacity of 94.97 GiB of which 218.81 MiB is free.
Process 2752205 has 91.82 GiB memory in use. Process 17 has 2.50 GiB memory in use. Of the allocated memory 91.19 GiB
is allocated by PyTorch, with 118.00 MiB
allocated in private pools (e.g., CUDA Graphs), and 744.36 MiB is reserved by
PyTorch but unallocated.
"""
    (ev,) = parse_log(text).events
    n = ev.numbers
    assert ev.gpu_index == 1
    assert n.other_processes_bytes == (gib(91.82), gib(2.50))
    assert n.private_pools_bytes == mib(118.00)
    assert n.reserved_unallocated_bytes == mib(744.36)
    assert n.process_in_use_bytes is None
    assert len(ev.frames) == 1 and ev.frames[0].function == "<module>"


def test_old_cached_form_and_allowed_fraction():
    old = ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 11.17 GiB total capacity; "
           "10.62 GiB already allocated; 145.81 MiB free; 10.66 GiB cached)")
    n = parse_log(old).events[0].numbers
    assert (n.reserved_bytes, n.free_bytes) == (gib(10.66), mib(145.81))
    capped = ("CUDA out of memory. Tried to allocate 1.00 GiB (GPU 3; 79.15 GiB total capacity; 38.00 GiB already "
              "allocated; 40.12 GiB free; 39.50 GiB allowed; 38.10 GiB reserved in total by PyTorch)")
    n = parse_log(capped).events[0].numbers
    assert (n.allowed_bytes, n.reserved_bytes) == (gib(39.50), gib(38.10))
    assert parse_log(capped).events[0].gpu_index == 3


def test_notebook_traceback():
    text = """---------------------------------------------------------------------------
OutOfMemoryError                          Traceback (most recent call last)
Cell In[5], line 12
     10 for batch in loader:
---> 12     loss = model(**batch).loss
     13     loss.backward()

File /opt/conda/lib/python3.10/site-packages/torch/nn/modules/module.py:1518, in Module._wrapped_call_impl(self, *args, **kwargs)
   1517 else:
-> 1518     return self._call_impl(*args, **kwargs)

File /opt/conda/lib/python3.10/site-packages/transformers/models/llama/modeling_llama.py:1183, in LlamaForCausalLM.forward(self, input_ids)
-> 1183 logits = logits.float()

OutOfMemoryError: CUDA out of memory. Tried to allocate 3.91 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.20 GiB is free. Process 88 has 77.94 GiB memory in use. Of the allocated memory 74.02 GiB is allocated by PyTorch, and 3.40 GiB is reserved by PyTorch but unallocated.
"""
    d = diagnose_log(text)
    assert [(f.function, f.line, f.code) for f in d.primary.frames] == [
        ("<cell>", 12, "loss = model(**batch).loss"),
        ("_wrapped_call_impl", 1518, "return self._call_impl(*args, **kwargs)"),
        ("forward", 1183, "logits = logits.float()")]
    assert d.phase == "forward" and d.primary.numbers.other_processes_bytes == (gib(77.94),)


def test_timestamped_and_host_prefixed_logs():
    k8s = """2024-05-01T10:00:00.123456Z stderr F Traceback (most recent call last):
2024-05-01T10:00:00.123456Z stderr F   File "/opt/deepspeed/runtime/engine.py", line 1799, in _take_model_step
2024-05-01T10:00:00.123456Z stderr F     self.optimizer.step()
2024-05-01T10:00:00.123456Z stderr F torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB (GPU 2; 39.39 GiB total capacity; 37.10 GiB already allocated; 900.19 MiB free; 37.60 GiB reserved in total by PyTorch)
"""
    d = diagnose_log(k8s)
    assert d.phase == "optimizer_step" and d.primary.gpu_index == 2
    assert d.primary.numbers.free_bytes == mib(900.19)
    pdsh = """worker-1: Traceback (most recent call last):
worker-1:   File "/usr/lib/python3/dist-packages/deepspeed/runtime/engine.py", line 1001, in _configure_distributed_model
worker-1:     self.module.to(self.device)
worker-0: step 1
worker-1: RuntimeError: CUDA out of memory. Tried to allocate 64.00 MiB (GPU 1; 15.78 GiB total capacity; 14.90 GiB already allocated; 31.19 MiB free; 14.95 GiB reserved in total by PyTorch)
"""
    d = diagnose_log(pdsh)
    assert (d.primary.host, d.primary.gpu_index, d.phase) == ("worker-1", 1, "initialize.move")


# -------------------------------------------------------------------------------- the other kinds

@pytest.mark.parametrize("line, exit_code", [
    ("Killed", None),
    ("./train.sh: line 3: 12345 Killed                  python train.py", None),
    ("[2022-01-10 11:05:03,873] [ERROR] [launch.py:166:sigkill_handler] ['python', 'train.py'] exits with return code = -9", -9),
    ("subprocess.CalledProcessError: Command '['python', 'train.py']' died with <Signals.SIGKILL: 9>.", -9),
    ("Process exited with code 137", 137),
    ("[Sat Jan 10 09:15:58 2026] Out of memory: Killed process 2301 (python3) total-vm:98765432kB", None),
])
def test_host_oom_signs(line, exit_code):
    (ev,) = parse_log(f"step 10\n{line}\n").events
    assert ev.kind == EventKind.HOST_OOM
    assert ev.exit_code == exit_code


@pytest.mark.parametrize("noise", [
    "[launch.py:160:sigkill_handler] Killing subprocess 31942",
    "[launch.py:166:sigkill_handler] ['python', 'train.py'] exits with return code = 1",
    "failed (exitcode: 1) local_rank: 0 (pid: 5187) of binary: /usr/bin/python3",
    "Skilled workers: 4",
    "torch.OutOfMemoryError is raised when the GPU is full",  # prose, no message
    "memory usage: 12 GB",
])
def test_no_false_alarms(noise):
    assert parse_log(noise + "\n").events == ()


def test_default_cpu_allocator_with_traceback():
    text = """Traceback (most recent call last):
  File "/usr/local/lib/python3.10/dist-packages/transformers/modeling_utils.py", line 3550, in from_pretrained
    model = cls(config, *model_args, **model_kwargs)
RuntimeError: [enforce fail at alloc_cpu.cpp:83] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate 1913151488 bytes. Error code 12 (Cannot allocate memory)
"""
    d = diagnose_log(text)
    assert d.primary.kind == EventKind.HOST_OOM
    assert d.primary.numbers.tried_to_allocate_bytes == 1_913_151_488
    assert d.phase == "load"


def test_python_memory_error_is_host_oom():
    text = 'Traceback (most recent call last):\n  File "a.py", line 1, in <module>\n    x = [0] * 10**12\nMemoryError\n'
    assert parse_log(text).events[0].kind == EventKind.HOST_OOM


def test_cublas_alloc_failure_is_a_numberless_gpu_oom():
    text = "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
    (ev,) = parse_log(text).events
    assert ev.kind == EventKind.CUDA_ERROR_OOM and ev.numbers is None


def test_nccl_out_of_memory_is_memory_and_wins_over_a_timeout():
    text = """[rank1]: [E ProcessGroupNCCL.cpp:475] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 1800000 milliseconds before timing out.
[rank0]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3
[rank0]: ncclUnhandledCudaError: Call to CUDA function failed.
[rank0]: Last error:
[rank0]: Cuda failure 'out of memory'
"""
    d = diagnose_log(text)
    assert len(d.events) == 2
    assert d.primary.rank == 0 and d.primary.out_of_memory
    assert "ncclUnhandledCudaError" in d.primary.detail and "Cuda failure 'out of memory'" in d.primary.detail


def test_missing_cuda_home_is_an_op_build_failure_and_comes_first():
    text = """torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 23.69 GiB of which 1.06 MiB is free.
deepspeed.ops.op_builder.builder.MissingCUDAException: CUDA_HOME does not exist, unable to compile CUDA op(s)
"""
    d = diagnose_log(text)
    assert d.primary.kind == EventKind.OP_BUILD_ERROR
    assert d.primary.line == 2


def test_op_build_failure_names_the_op_and_the_compiler_error():
    text = """Using /root/.cache/torch_extensions/py310_cu121 as PyTorch extensions root...
[INFO] something: error: unrelated, long before the build
Emitting ninja build file /root/.cache/torch_extensions/py310_cu121/fused_adam/build.ninja...
Building extension module fused_adam...
/usr/local/cuda/include/crt/host_config.h:132:2: error: #error -- unsupported GNU version! gcc versions later than 11 are not supported!
ninja: build stopped: subcommand failed.
"""
    d = diagnose_log(text)
    assert d.primary.kind == EventKind.OP_BUILD_ERROR
    assert d.primary.detail.startswith("fused_adam: /usr/local/cuda/include/crt/host_config.h:132:2: error:")
    assert "building fused_adam failed (/usr/local/cuda" in d.explanation[0]


# ------------------------------------------------------------------------------------- fixtures

def test_fixture_seed_move_oom():
    d = diagnose_log(read("seed-move-oom-ds0510.txt"))
    e = d.primary
    assert e.kind == EventKind.GPU_OOM and len(d.events) == 1  # the launcher's "Killing subprocess" is no event
    n = e.numbers
    assert (n.tried_to_allocate_bytes, n.total_capacity_bytes, n.allocated_bytes, n.free_bytes, n.reserved_bytes) == (
        mib(32), gib(23.69), gib(9.38), mib(20.56), gib(9.41))
    assert d.phase == "initialize.move" and d.phase_source == "traceback"
    assert d.phase_frame.function == "_configure_distributed_model" and d.phase_frame.line == 1001
    assert "module.to(self.device)" in d.phase_reason and "innermost" not in d.phase_reason
    assert d.deepspeed_version == "0.5.10"
    assert any(f.id == "log-gpu-shared" for f in d.findings)


def test_fixture_seed_pinned_partition():
    d = diagnose_log(read("seed-pinned-partition-ds0510.txt"))
    e = d.primary
    assert e.kind == EventKind.PINNED_HOST_OOM and e.numbers is None and e.gpu_index is None
    assert d.phase == "initialize.partition"
    assert d.phase_frame.function == "_partition_param" and "pin_memory()" in d.phase_frame.code
    assert [f.function for f in e.frames][:2] == ["<module>", "main"] and len(e.frames) == 13
    assert any("pin_memory" in s for s in d.fixes)


def test_fixture_seed_host_oom_torchrun():
    d = diagnose_log(read("seed-host-oom-torchrun-ds0198.txt"))
    e = d.primary
    assert e.kind == EventKind.HOST_OOM and len(d.events) == 1
    assert e.exit_code == -9 and e.rank == 0
    assert d.phase == "initialize.cast" and d.phase_source == "progress"
    assert "DeepSpeed info: version=0.19.8" in d.phase_reason
    assert e.frames == ()  # torchrun's own ChildFailedError traceback is not the worker's
    assert d.deepspeed_version == "0.19.8"


def test_fixture_torch2_backward_two_ranks_interleaved_with_colours():
    text = read("torch2-backward-oom-ds0198.txt")
    assert "\x1b[" in text and "[rank1]: " in text
    d = diagnose_log(text)
    r0, r1 = d.events
    assert (r0.rank, r0.gpu_index, r1.rank, r1.gpu_index) == (0, 0, 1, 1)
    assert (r0.numbers.tried_to_allocate_bytes, r0.numbers.free_bytes, r0.numbers.allocated_bytes) == (
        mib(2), mib(1.06), gib(22.91))
    assert (r1.numbers.tried_to_allocate_bytes, r1.numbers.free_bytes, r1.numbers.allocated_bytes,
            r1.numbers.reserved_unallocated_bytes) == (mib(64), mib(45.06), gib(22.80), mib(512.34))
    assert len(r0.frames) == len(r1.frames) == 7
    assert all("\x1b" not in f.code and "^" not in f.code for f in r0.frames)
    assert d.primary is r0 and d.phase == "backward"
    assert d.deepspeed_version == "0.19.8"  # read through the ANSI colours


def test_fixture_nccl():
    d = diagnose_log(read("nccl-shm-system-error.txt"))
    e = d.primary
    assert e.kind == EventKind.NCCL_ERROR and e.rank == 1 and not e.out_of_memory
    assert "ncclSystemError" in e.detail and "/dev/shm/nccl-vzIpS6" in e.detail and "NCCL 2.21.5" in e.detail
    assert d.phase == "initialize.move" and d.phase_frame.function == "_broadcast_model"
    assert any("shm" in s for s in d.fixes)
    assert not any("zero.Init" in s for s in d.fixes)  # memory advice only for memory failures


def test_fixture_cpu_adam_build(seed):
    text = read("cpu-adam-build-ds0510.txt")
    d = diagnose_log(text)
    e = d.primary
    assert e.kind == EventKind.OP_BUILD_ERROR and len(d.events) == 1
    assert e.detail.startswith("cpu_adam: nvcc fatal") and "compute_86" in e.detail
    assert e.message == "RuntimeError: Error building extension 'cpu_adam'"
    assert d.phase == "initialize.optimizer" and d.phase_frame.function == "__init__"
    sc, plan = seed  # ZeRO-3: the replay's seams put the basic optimizer in initialize.partition
    assert diagnose_log(text, plan, sc).phase == "initialize.partition"
    assert diagnose_log(text, plan, sc).reconciliation is None


def test_every_fixture_is_recognised():
    names = sorted(p.name for p in LOGS.glob("*.txt"))
    kinds = {diagnose_log(read(n)).primary.kind for n in names}
    assert kinds == {EventKind.GPU_OOM, EventKind.PINNED_HOST_OOM, EventKind.HOST_OOM, EventKind.NCCL_ERROR,
                     EventKind.OP_BUILD_ERROR}


def _source_root(package: str) -> Path:
    spec = importlib.util.find_spec(package)  # locates, does not import
    return Path(spec.origin).parent.parent


@pytest.mark.parametrize("name", sorted(p.name for p in LOGS.glob("*.txt")))
def test_fixture_frames_match_the_real_source(name, request):
    """Each DeepSpeed/torch frame's line number and code are the real ones: 0.19.8 and torch from the
    installed packages, 0.5.10 and 0.5.8 from their sdists (the ``ds0510``/``ds058`` fixtures; torch 1.x
    frames unchecked)."""
    old_fixture = "ds0510" if "ds0510" in name else "ds058" if "ds058" in name else None
    old = old_fixture is not None
    checked = 0
    for ev in parse_log(read(name)).events:
        for f in ev.frames:
            pkg = f.short_path.split("/")[0]
            if pkg not in ("deepspeed", "torch") or (old and pkg == "torch"):
                continue
            root = request.getfixturevalue(old_fixture) if old else _source_root(pkg)
            line = (root / f.short_path).read_text().splitlines()[f.line - 1].strip()
            assert f.code.startswith(line), f"{name}: {f.short_path}:{f.line} is {line!r}, fixture says {f.code!r}"
            checked += 1
    if "host-oom" not in name:
        assert checked >= 3


HAS_TORCH = importlib.util.find_spec("torch") is not None


def _run_python(code: str, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow  # importing torch takes seconds
@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
def test_real_torch_host_allocation_failure():
    """The message torch itself raises when the host allocation fails (CPU build: DefaultCPUAllocator)."""
    r = _run_python("import torch\ndef load():\n    return torch.empty(2**50, dtype=torch.uint8)\nload()\n")
    assert r.returncode != 0 and "DefaultCPUAllocator" in r.stderr
    d = diagnose_log(r.stderr)
    assert d.primary.kind == EventKind.HOST_OOM
    assert d.primary.numbers.tried_to_allocate_bytes == 2**50
    assert [f.function for f in d.primary.frames][-1] == "load"


TORCHRUN = Path(sys.prefix) / ("Scripts" if os.name == "nt" else "bin") / "torchrun"
"""torch's console script in this interpreter's environment (never a ``torchrun`` found on PATH,
which may belong to another Python)."""


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TORCH, reason="needs torch (pip install torch): torchrun is part of it")
def test_real_torchrun_sigkill(tmp_path):
    """A worker killed with SIGKILL (what the kernel's OOM killer sends), reported by the real torchrun."""
    script = tmp_path / "train.py"
    script.write_text("import os, signal\n"
                      "print('[INFO] [logging.py:107:log_dist] [Rank 0] DeepSpeed info: version=0.19.8', flush=True)\n"
                      "os.kill(os.getpid(), signal.SIGKILL)\n")
    assert TORCHRUN.exists(), f"torch is installed but its torchrun script is not at {TORCHRUN}"
    r = subprocess.run([str(TORCHRUN), "--nproc_per_node", "2", "--master_port", "29537", str(script)],
                       capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    d = diagnose_log(r.stdout + r.stderr)
    assert r.returncode != 0
    assert d.primary.kind == EventKind.HOST_OOM and d.primary.exit_code == -9
    assert d.primary.rank == int(re.search(r"Root Cause.*?rank\s*:\s*(\d+)", r.stderr, re.S).group(1))
    assert d.phase == "initialize.cast" and d.phase_source == "progress"


# --------------------------------------------------------------------------------- reconciliation

def test_seed_move_oom_reconciles_with_the_plans_gpu_items(seed):
    sc, plan = seed
    d = diagnose_log(read("seed-move-oom-ds0510.txt"), plan, sc)
    r = d.reconciliation
    move = plan.phase("initialize.move")
    gpu_items = [it for it in move.items if it.device == Device.GPU]
    assert r.phase == "initialize.move" and r.device == "gpu"
    assert sorted(it.key for it in r.items) == sorted(it.key for it in gpu_items)
    assert "move.params" in {it.key for it in r.items}
    rows = {row.label.split(":")[0]: row for row in r.rows}
    assert rows["GPU total capacity"].log_bytes == gib(23.69)
    assert rows["GPU total capacity"].plan_bytes == sc.hardware.gpu.total_bytes
    tensors = rows["tensors"]
    assert tensors.log_bytes == gib(9.38) + mib(32)
    assert tensors.plan_bytes == sum(it.bytes for it in gpu_items if it.key != "runtime.cuda_context")
    fails_here = any(f.phase == "initialize.move" and f.device == "gpu" for f in plan.verdict.failures)
    assert r.plan_verdict == ("predicted" if fails_here else "not_predicted" if plan.verdict.fits
                              else "predicted_elsewhere")
    assert any("another rank" in s for s in r.lines)  # 14.26 GiB outside the allocator ~ one rank's move peak
    assert any(f.id == "plan-missed-failure" for f in d.findings) == (r.plan_verdict == "not_predicted")


def test_gpu_reconciliation_uses_the_allocator_figures(seed):
    """The reserved row is the caching allocator simulation's reserved peak (what the OOM message's
    "reserved by PyTorch" reports), and "free" is the card less the OOM-relevant peak the verdict
    uses, not less the requested tensor bytes."""
    sc, plan = seed
    r = diagnose_log(read("seed-move-oom-ds0510.txt"), plan, sc).reconciliation
    move = plan.phase("initialize.move")
    assert move.allocators_simulated and move.gpu_oom_relevant_bytes > move.gpu_peak_bytes - 2**30
    rows = {row.label.split(" (")[0].split(":")[0]: row for row in r.rows}
    assert rows["reserved by PyTorch"].plan_bytes == move.gpu_reserved_bytes
    assert rows["reserved by PyTorch"].log_bytes == gib(9.41)  # the log: "9.41 GiB reserved in total by PyTorch"
    assert rows["free"].plan_bytes == max(sc.hardware.gpu.total_bytes - move.gpu_oom_relevant_bytes, 0)


def test_plan_that_fails_at_move_predicts_the_log(seed):
    from memfit.core.plan import make_plan
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.inputs import ScenarioInputs, merge_inputs
    from memfit.core.scenario.read import read_scenario_file

    # low_cpu_mem_usage: the example's transformers 4.15 would otherwise put the host over its RAM at load first
    small = build_scenario(merge_inputs(read_scenario_file(SEED), ScenarioInputs(gpus="2x12GiB",
                                                                                 low_cpu_mem_usage=True)))
    plan = make_plan(small)
    first = plan.verdict.failures[0]
    assert (first.phase, first.device) == ("initialize.move", "gpu")  # the premise, from the real ledger
    r = diagnose_log(read("seed-move-oom-ds0510.txt"), plan, small).reconciliation
    assert r.plan_verdict == "predicted" and r.plan_failure == first
    assert any("from another card" in s for s in r.lines)  # the log's 23.69 GiB is not the scenario's 12 GiB


def test_seed_pinned_failure_shows_pinned_bytes_per_rank_and_node(seed):
    sc, plan = seed
    r = diagnose_log(read("seed-pinned-partition-ds0510.txt"), plan, sc).reconciliation
    part = plan.phase("initialize.partition")
    rows = {row.label: row.plan_bytes for row in r.rows}
    assert rows["pinned per rank"] == part.cpu_pinned_bytes
    ranks = part.ranks_per_node
    assert rows[f"pinned per node ({ranks} ranks)"] == sum(
        it.bytes * (1 if it.rank0_only else ranks) for it in part.items if it.device == Device.CPU_PINNED)
    assert rows["host memory per node (pinned + pageable)"] == part.node_cpu_peak_bytes
    assert rows["host RAM per node"] == sc.hardware.cpu_ram_bytes
    assert r.device == "cpu" and all(it.device != Device.GPU for it in r.items)
    assert any(it.key == "zero3.param_partitions" for it in r.items)


def test_seed_traceback_of_deepspeed_058_names_the_plans_resource(seed):
    """The issue-style traceback (DeepSpeed 0.5.8's frames) against the plan of the example as it ran:
    the same resource (host RAM), the plan's first failure earlier (from_pretrained, transformers
    4.15's default), and the reconciliation says so."""
    sc, plan = seed
    d = diagnose_log(read("seed-pinned-partition-ds058.txt"), plan, sc)
    assert d.primary.kind == EventKind.PINNED_HOST_OOM and d.phase == "initialize.partition"
    assert d.deepspeed_version == "0.5.8" and not any(f.id == "log-deepspeed-version" for f in d.findings)
    first = plan.verdict.failures[0]
    assert (first.phase, first.device) == ("load", "cpu")  # the premise, from the ledger of the 2021 stack
    r = d.reconciliation
    assert r.device == "cpu" and r.plan_verdict == "predicted_elsewhere" and r.plan_failure == first
    assert r.lines[1].startswith("Resource: the same one, host RAM; the plan has it exhausted before "
                                 "initialize.partition, in load")


def test_host_kill_from_progress_line_is_bounded_from_below(seed):
    sc, plan = seed
    d = diagnose_log(read("seed-host-oom-torchrun-ds0198.txt"), plan, sc)
    r = d.reconciliation
    assert r.phase == "initialize.cast" and "or later" in r.phase_basis
    assert any(f.id == "log-deepspeed-version" for f in d.findings)  # log 0.19.8, scenario models 0.5


def test_gpu_oom_without_phase_is_compared_with_the_plans_gpu_peak(seed):
    """The plan's GPU peak is the figure the verdict compares: the allocator simulation's OOM-relevant
    bytes (the seed on DeepSpeed 0.5/torch 1.10 peaks there in step2.backward, while the requested
    tensor bytes peak in initialize.move)."""
    sc, plan = seed
    text = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of "
            "23.69 GiB of which 1.06 MiB is free.")
    r = diagnose_log(text, plan, sc).reconciliation
    assert r.phase == max(plan.phases, key=lambda p: p.gpu_oom_relevant_bytes).name
    assert "no phase" in r.phase_basis


# ------------------------------------------------------------------------------------ bad input

def test_empty_and_unrecognised_logs():
    for text, headline in (("", "the log is empty"), ("  \n\n", "the log is empty"),
                           ("epoch 1 loss 2.3\nall good\n", "no recognisable error in the log")):
        d = diagnose_log(text)
        assert d.primary is None and d.events == () and d.headline == headline


def test_read_log_errors(tmp_path):
    with pytest.raises(MemfitError, match="log file not found"):
        read_log(tmp_path / "missing.txt")
    with pytest.raises(MemfitError, match="not a file"):
        read_log(tmp_path)
    (tmp_path / "bin").write_bytes(b"\x00\x01\x02")
    with pytest.raises(MemfitError, match="not a text file"):
        read_log(tmp_path / "bin")


def test_results_are_frozen():
    d = diagnose_log(read("seed-move-oom-ds0510.txt"))
    with pytest.raises(FrozenInstanceError):
        d.phase = "forward"
    assert replace(d.primary, line=1).line == 1


def test_core_import_is_light():
    code = ("import sys; from memfit.core.diagnose import diagnose_log; "
            "diagnose_log(open(sys.argv[1]).read()); "
            "bad = [m for m in ('torch', 'deepspeed', 'transformers', 'peft', 'rich') if m in sys.modules]; "
            "assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code, str(LOGS / "seed-move-oom-ds0510.txt")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
