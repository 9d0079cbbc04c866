"""Before the first step, outside DeepSpeed: ``from_pretrained`` (optionally quantizing with
bitsandbytes), ``prepare_model_for_kbit_training``, the PEFT wrap, the precision cast, the move to
the GPU and the optimizer's construction.

Mirrors:
- transformers 5.24 ``PreTrainedModel.from_pretrained``: without quantization the weights are
  loaded into host memory in ``torch_dtype``, one tensor per parameter; module buffers are created
  in their own dtype. With a ``BitsAndBytesConfig`` and a GPU ``device_map`` every tensor goes
  straight to the GPU (``quantizers/quantizer_bnb_4bit.py``); a quantized weight is moved whole in
  its dtype and quantized there (``bitsandbytes/nn/modules.py:Params4bit._quantize``: ``w =
  self.data.contiguous().to(device)``, ``quantize_4bit(w)``), the full weight freed afterwards.
- peft 0.21 ``prepare_model_for_kbit_training``: ``param.data = param.data.to(torch.float32)`` for
  every fp16/bf16 param that is not a ``Params4bit``, one at a time.
- peft ``get_peft_model``: adapters created in fp32 next to their base layer.
- pure 16-bit precision from an fp32 load: ``model.to(dtype)``, one param at a time where it sits.
- the Trainer's ``_move_model_to_device`` (``model.to(args.device)``: ``Module._apply``, each param
  copied to the GPU and its host tensor freed), skipped for a model loaded onto the GPU by
  ``device_map`` and a no-op on the CPU.
- the optimizer's ``__init__``: torch optimizers allocate nothing until the first ``step()``;
  bitsandbytes' 8-bit optimizers fill two 256-entry fp32 quantization maps on the host
  (``Optimizer8bit.fill_qmap``).
"""

from __future__ import annotations

from memfit.core.alloc.non_pytorch import record_cuda_context as _record_cuda_context
from memfit.core.ledger import host_process
from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger.pytorch.params import TorchModel
from memfit.core.ledger_types import Device
from memfit.core.optimizers import BNB_QMAP_BYTES, OptimizerModel
from memfit.core.precision import DTYPE_BYTES
from memfit.core.quant import SRC as BNB_SRC
from memfit.core.scenario.types import Scenario

HOST_LOADED = "load.weights"
HOST_ADAPTERS = "load.adapter_weights"
HOST_BUFFERS = "load.buffers"
HOST_CAST = "setup.cast_params"
GPU_PARAMS = "move.params"
GPU_BUFFERS = "move.buffers"
QUANT = "quant.weights"
QUANT_SHARED = "quant.dynamic_map"
QUANT_STAGING = "quant.full_weight_while_quantizing"
QMAPS_HOST = "optimizer.qmaps_host"
TF = "transformers 5.24"

Where = dict[str, tuple[str, str]]
"""param name -> (ledger key holding it, its dtype)"""


def loads_onto_gpu(sc: Scenario) -> bool:
    """bitsandbytes needs a GPU ``device_map``: the model is loaded (and quantized) on the GPU."""
    return sc.quant.enabled


def record_process(t: Timeline, sc: Scenario) -> None:
    """The process before the model (``ledger.host_process``): the interpreter and torch, transformers
    and peft, the tokenizer, an in-memory dataset; DeepSpeed is not imported outside it."""
    host_process.record(t, [p for p in host_process.load_parts(sc.model.arch.vocab_size, sc.train.dataset_tokens)
                            if p.key != "host.deepspeed"])


def record_cuda_context(t: Timeline, sc: Scenario) -> None:
    """The CUDA context (+ NCCL) on the GPU and the CUDA libraries' host memory, at the first CUDA call
    (once: a later call finds it made)."""
    from memfit.core.alloc.non_pytorch import CONTEXT_KEY

    if t.live_bytes(CONTEXT_KEY):
        return
    _record_cuda_context(t, sc)
    if t.accelerator == "cuda":
        host_process.record(t, [host_process.cuda_part()])


def record_load(t: Timeline, sc: Scenario, m: TorchModel, *, rank0_only: bool = False,
                quant_to_host: bool = False) -> Where:
    """``from_pretrained`` (+ quantization, + prepare_model_for_kbit_training) and the PEFT wrap.
    ``rank0_only``: only rank 0 loads the weights (accelerate's FSDP ``cpu_ram_efficient_loading``:
    the other ranks build the model on the meta device). ``quant_to_host``: a bitsandbytes base under
    that loading in transformers 4.39-4.57 (``stack.transformers.fsdp_efficient_loading``): each
    weight quantized on the GPU, its packed storage then moved to rank 0's host."""
    t.phase("load", "from_pretrained" + (" with bitsandbytes quantization onto the GPU" if sc.quant.enabled else "")
            + (" and the PEFT wrap" if sc.peft.method not in ("full", "freeze") else ""))
    record_process(t, sc)
    where: Where = {}
    base = [p for p in m.params if not p.adapter]
    ads = [p for p in m.params if p.adapter]
    lb = DTYPE_BYTES[sc.load.dtype]
    if quant_to_host and sc.quant.enabled:
        _load_quantized_to_host(t, sc, m, where, base, lb, rank0_only=rank0_only)
    elif loads_onto_gpu(sc):
        record_cuda_context(t, sc)
        q = sc.quant
        n_q = sum(1 for p in base if p.quantized)
        t.declare(GPU_PARAMS, name=f"non-quantized params on the GPU ({sc.load.dtype}, loaded there by device_map)",
                  device=Device.GPU, category="params",
                  formula=f"{sum(p.numel for p in base if not p.quantized):,} params x {lb} B",
                  source=f"{TF} modeling_utils.py:from_pretrained (device_map on the GPU)")
        t.declare(QUANT_STAGING, name="full-precision weight on the GPU while bitsandbytes quantizes it",
                  device=Device.GPU, category="params", formula=f"one weight at a time x {lb} B",
                  source=f"{BNB_SRC} nn/modules.py:Params4bit._quantize (self.data.contiguous().to(device))")
        what = (f"{q.quant_type}{' + double quant' if q.double_quant else ''}, storage {q.quant_storage}"
                if q.method == "4bit" else "LLM.int8(): int8 CB + fp32 SCB per row")
        t.declare(QUANT, name=f"quantized weights ({q.method}: {what})", device=Device.GPU, category="params",
                  formula=(f"{n_q} weights: packed (n+1)//2 B + absmax per 64 "
                           + ("(uint8, + fp32 per 256 of them + offset)" if q.double_quant else "(fp32)")
                           + " + 16-entry code" if q.method == "4bit" else f"{n_q} weights: n B + out_features x 4 B"),
                  source=f"{BNB_SRC} functional.py:quantize_4bit / int8_vectorwise_quant")
        shared = m.shared_quant_bytes
        if shared:
            t.declare(QUANT_SHARED, name="dynamic quantization map of double quantization (cached once per device)",
                      device=Device.GPU, category="params", formula="256 x 4 B",
                      source=f"{BNB_SRC} functional.py:quantize_blockwise (name2qmap['dynamic'])")

        def quantize(p) -> None:
            fp16_copy = q.method == "8bit" and sc.load.dtype != "fp16"
            if fp16_copy:  # Int8Params._quantize: self.data.contiguous().to(device, dtype=torch.float16)
                t.alloc(QUANT_STAGING, p.numel * 2)
            for qt in p.quant:
                t.alloc(QUANT, qt.nbytes)
            if fp16_copy:
                t.free(QUANT_STAGING, p.numel * 2)
            if shared and t.live_bytes(QUANT_SHARED) == 0:
                t.alloc(QUANT_SHARED, shared)

        if sc.load.from_checkpoint:
            for p in base:  # each tensor to the GPU; a quantized one whole, then quantized, then freed
                if p.quantized:
                    t.alloc(QUANT_STAGING, p.numel * lb)
                    quantize(p)
                    t.free(QUANT_STAGING, p.numel * lb)
                    where[p.name] = (QUANT, "q")
                else:
                    t.alloc(GPU_PARAMS, p.numel * lb)
                    where[p.name] = (GPU_PARAMS, sc.load.dtype)
        else:
            # a random-init build (replays): from_config makes every weight first, then each
            # quantized weight goes through the same Params4bit(...).to(device) call
            for p in base:
                t.alloc(QUANT_STAGING if p.quantized else GPU_PARAMS, p.numel * lb)
                where[p.name] = (GPU_PARAMS, sc.load.dtype)
            for p in base:
                if p.quantized:
                    quantize(p)
                    t.free(QUANT_STAGING, p.numel * lb)
                    where[p.name] = (QUANT, "q")
        _buffers(t, sc, Device.GPU, GPU_BUFFERS)
        if sc.quant.prepare_kbit:
            _kbit_upcast(t, m, where)
    else:
        t.declare(HOST_LOADED, name=f"model weights ({sc.load.dtype}, as from_pretrained loads them)"
                  + (", rank 0 only (cpu_ram_efficient_loading)" if rank0_only else ""),
                  device=Device.CPU_PAGEABLE, category="params",
                  formula=f"{sum(p.numel for p in base):,} params x {lb} B, one tensor per param",
                  source=f"{TF} modeling_utils.py:PreTrainedModel.from_pretrained", rank0_only=rank0_only)
        for p in base:
            t.alloc(HOST_LOADED, p.numel * lb)
            where[p.name] = (HOST_LOADED, sc.load.dtype)
        tied = next((p for p in base if p.name == m.tied_embedding), None)
        if tied is not None and not sc.load.from_checkpoint:
            # from_config (random init, what replays build) creates the head's own weight before
            # tie_weights() points it at the embedding; from_pretrained builds it on the meta device
            t.declare("load.untied_head", name="output head weight created before tie_weights (random init only)",
                      device=Device.CPU_PAGEABLE, category="params", formula=f"{tied.numel:,} x {lb} B",
                      source=f"{TF} modeling_utils.py:PreTrainedModel.tie_weights (after __init__)")
            t.alloc("load.untied_head", tied.numel * lb)
            t.free("load.untied_head")
        _buffers(t, sc, Device.CPU_PAGEABLE, HOST_BUFFERS)
    on_gpu = loads_onto_gpu(sc) and not quant_to_host
    if sc.load.from_checkpoint:  # what from_pretrained leaves in the process (host_process.from_pretrained_part)
        host_process.record(t, [host_process.from_pretrained_part()])
    if ads:
        dev = Device.GPU if on_gpu else Device.CPU_PAGEABLE
        key = GPU_PARAMS if on_gpu else HOST_ADAPTERS
        if key == HOST_ADAPTERS:
            t.declare(HOST_ADAPTERS, name="PEFT-created weights (fp32, peft's default)", device=dev, category="params",
                      formula=f"{sum(p.numel for p in ads):,} params, {sum(p.numel * DTYPE_BYTES[p.load_dtype] for p in ads):,} B",
                      source="peft 0.21 tuners (LoraLayer.update_layer / PrefixEncoder): created in fp32")
        # (X-LoRA's classifier is created in the base's dtype, TParam.load_dtype, and never upcast)
        lora16 = [p for p in ads if "lora_" in p.name and p.load_dtype == "fp32" and not sc.quant.enabled
                  and sc.load.dtype != "fp32"]
        if lora16:
            # peft: each LoRA weight is created in fp32, moved to its base layer's dtype
            # (_move_adapter_to_device_of_base_layer), and after the injection upcast back to fp32
            # (cast_adapter_dtype, autocast_adapter_dtype=True), one param at a time
            t.declare("load.adapter_16bit", name=f"LoRA weights in the base layers' {sc.load.dtype} until peft upcasts them",
                      device=dev, category="params", formula=f"{sum(p.numel for p in lora16):,} x 2 B",
                      source="peft 0.21 tuners_utils.py:_move_adapter_to_device_of_base_layer, cast_adapter_dtype")
            for p in ads:
                t.alloc(key, p.numel * DTYPE_BYTES[p.load_dtype])
                if p in lora16:
                    t.alloc("load.adapter_16bit", p.numel * 2)
                    t.free(key, p.numel * 4)
            for p in lora16:
                t.alloc(key, p.numel * 4)
                t.free("load.adapter_16bit", p.numel * 2)
        else:
            for p in ads:
                t.alloc(key, p.numel * DTYPE_BYTES[p.load_dtype])
        for p in ads:
            where[p.name] = (key, p.load_dtype)
    if on_gpu:
        _describe_params(t, m, where, GPU_PARAMS)
    return where


HOST_QUANT = "load.quantized_on_host"


def _load_quantized_to_host(t: Timeline, sc: Scenario, m: TorchModel, where: Where, base, lb: int, *,
                            rank0_only: bool) -> None:
    """transformers 4.39-4.57 ``_load_state_dict_into_meta_model`` under FSDP's efficient loading: a
    quantized weight is put on the GPU in the load dtype, quantized there (``Params4bit._quantize``),
    and its packed data moved to rank 0's host (``type(value)(value.data.to("cpu"), **value.__dict__)``:
    the quantization state stays on the GPU); every other param goes to rank 0's host
    (``param_device = "cpu" if is_local_dist_rank_0() else "meta"``)."""
    q = sc.quant
    t.declare(QUANT_STAGING, name="full-precision weight on the GPU while bitsandbytes quantizes it",
              device=Device.GPU, category="params", formula=f"one weight at a time x {lb} B",
              source=f"{BNB_SRC} nn/modules.py:Params4bit._quantize (self.data.contiguous().to(device))")
    t.declare(QUANT, name=f"quantization states on the GPU ({q.method}: absmax, codes)", device=Device.GPU,
              category="params", formula="per quantized weight: its packed storage until moved to the host, then "
                                         "its absmax (+ double quant) and code, every rank",
              source=f"{BNB_SRC} functional.py:quantize_4bit (QuantState)")
    who = "rank 0's" if rank0_only else "every rank's"
    t.declare(HOST_QUANT, name=f"packed quantized weights on {who} host (FSDP loading)",
              device=Device.CPU_PAGEABLE, category="params",
              formula=f"{sum(1 for p in base if p.quantized)} weights' packed storage" + (", rank 0 only" if rank0_only else ""),
              source="transformers 4.39-4.57 modeling_utils.py:_load_state_dict_into_meta_model (quantize on the GPU, "
                     "then value.data.to('cpu'); meta off rank 0 from 4.45)", rank0_only=rank0_only)
    t.declare(HOST_LOADED, name=f"non-quantized params ({sc.load.dtype}) on {who} host (FSDP loading)",
              device=Device.CPU_PAGEABLE, category="params",
              formula=f"{sum(p.numel for p in base if not p.quantized):,} params x {lb} B" + (", rank 0 only" if rank0_only else ""),
              source="transformers 4.39-4.57 modeling_utils.py:_load_state_dict_into_meta_model (param_device cpu; "
                     "meta off local rank 0 from 4.36)", rank0_only=rank0_only)
    shared = m.shared_quant_bytes
    if shared:
        t.declare(QUANT_SHARED, name="dynamic quantization map of double quantization (cached once per device)",
                  device=Device.GPU, category="params", formula="256 x 4 B",
                  source=f"{BNB_SRC} functional.py:quantize_blockwise (name2qmap['dynamic'])")
    record_cuda_context(t, sc)
    for p in base:
        if p.quantized:
            t.alloc(QUANT_STAGING, p.numel * lb)
            for qt in p.quant:
                t.alloc(QUANT, qt.nbytes)
            if shared and t.live_bytes(QUANT_SHARED) == 0:
                t.alloc(QUANT_SHARED, shared)
            t.free(QUANT_STAGING, p.numel * lb)
            t.alloc(HOST_QUANT, p.quant[0].nbytes)  # the packed data to the host
            t.free(QUANT, p.quant[0].nbytes)
            where[p.name] = (HOST_QUANT, "q")
        else:
            t.alloc(HOST_LOADED, p.numel * lb)
            where[p.name] = (HOST_LOADED, sc.load.dtype)
    _buffers(t, sc, Device.CPU_PAGEABLE, HOST_BUFFERS)
    if sc.quant.prepare_kbit:  # on the host, where the non-quantized params now are
        ups = [p for p in base if not p.quantized and p.load_dtype != "fp32"]
        for p in ups:
            t.alloc(HOST_LOADED, p.numel * 4)
            t.free(HOST_LOADED, p.numel * lb)
            where[p.name] = (HOST_LOADED, "fp32")


def _describe_params(t: Timeline, m: TorchModel, where: Where, key: str) -> None:
    """``key``'s formula from what it holds now: params per dtype (after a cast or
    prepare_model_for_kbit_training's upcast, with the adapters)."""
    by: dict[str, list[int]] = {}
    for p in m.params:
        k, dtype = where.get(p.name, (None, None))
        if k == key:
            n = by.setdefault(dtype, [0, 0])
            n[0] += p.numel
            n[1] += p.adapter
    if by:
        t.describe(key, " + ".join(f"{n:,} params x {DTYPE_BYTES[d]} B ({d}"
                                   + (f", {a} adapter tensors" if a else "") + ")" for d, (n, a) in sorted(by.items())))


def _buffers(t: Timeline, sc: Scenario, device: Device, key: str) -> None:
    m = sc.model
    if not m.buffers:
        return
    t.declare(key, name="module buffers (rotary tables, position ids)", device=device, category="buffers",
              formula=f"{len(m.buffers)} buffer(s), {m.buffer_bytes:,} B in their own dtypes",
              source="transformers modeling code (register_buffer); model.named_buffers()")
    for b in m.buffers:
        t.alloc(key, b.nbytes)


def _kbit_upcast(t: Timeline, m: TorchModel, where: Where) -> None:
    """prepare_model_for_kbit_training: 16-bit non-quantized params to fp32, one at a time."""
    ups = [p for p in m.params if not p.adapter and not p.quantized and p.load_dtype != "fp32"]
    if not ups:
        return
    t.declare("kbit.upcast", name="fp32 copy being made by prepare_model_for_kbit_training", device=Device.GPU,
              category="params", formula="one param at a time x 4 B",
              source="peft 0.21 utils/other.py:prepare_model_for_kbit_training (param.data.to(torch.float32))")
    for p in ups:
        key, dtype = where[p.name]
        t.alloc(GPU_PARAMS, p.numel * 4)
        t.free(key, p.numel * DTYPE_BYTES[dtype])
        where[p.name] = (GPU_PARAMS, "fp32")


def record_setup(t: Timeline, sc: Scenario, m: TorchModel, where: Where, opt: OptimizerModel, *,
                 description: str | None = None, move: bool = True) -> None:
    """The precision cast, the move to the GPU and the optimizer's construction (``setup``)."""
    t.phase("setup", description or "precision cast, model.to(device), optimizer construction")
    if not loads_onto_gpu(sc):
        record_cuda_context(t, sc)
    casts = [p for p in m.params if not p.quantized and where[p.name][1] != p.dtype]
    if casts:
        t.declare(HOST_CAST if not loads_onto_gpu(sc) else GPU_PARAMS,
                  name=f"params cast to their training dtype ({m.precision.mode})",
                  device=Device.GPU if loads_onto_gpu(sc) else Device.CPU_PAGEABLE, category="params",
                  formula=f"{sum(p.numel for p in casts):,} params, one at a time (the old copy freed)",
                  source="torch nn/modules/module.py:Module.to(dtype) (per-param cast)")
        for p in casts:
            old, dtype = where[p.name]
            new = GPU_PARAMS if loads_onto_gpu(sc) else HOST_CAST
            t.alloc(new, p.numel * p.elem_bytes)
            t.free(old, p.numel * DTYPE_BYTES[dtype])
            where[p.name] = (new, p.dtype)
        if loads_onto_gpu(sc):
            _describe_params(t, m, where, GPU_PARAMS)
    if move and not loads_onto_gpu(sc) and t.accelerator == "cuda":
        t.declare(GPU_PARAMS, name="model params on the GPU", device=Device.GPU, category="params",
                  formula=f"{sum(p.numel for p in m.params):,} params in their training dtypes",
                  source=f"{TF} trainer.py:_move_model_to_device (model.to(device), Module._apply per param)")
        for p in m.params:
            old, dtype = where[p.name]
            nb = p.numel * DTYPE_BYTES[dtype]
            t.alloc(GPU_PARAMS, nb)
            t.free(old, nb)
            where[p.name] = (GPU_PARAMS, dtype)
        live = t.live_bytes(HOST_BUFFERS)
        if live:
            t.declare(GPU_BUFFERS, name="module buffers on the GPU", device=Device.GPU, category="buffers",
                      formula=f"{live:,} B", source="torch nn/modules/module.py:Module._apply")
            for b in sc.model.buffers:
                t.alloc(GPU_BUFFERS, b.nbytes)
                t.free(HOST_BUFFERS, b.nbytes)
    record_optimizer_construction(t, opt)


def record_optimizer_construction(t: Timeline, opt: OptimizerModel) -> None:
    """The optimizer's ``__init__``: only bitsandbytes' 8-bit optimizers allocate (their maps)."""
    if opt.bnb and opt.state_bits == 8:
        t.declare(QMAPS_HOST, name="8-bit optimizer quantization maps (signed and unsigned, on the host)",
                  device=Device.CPU_PAGEABLE, category="optimizer", formula=f"2 x {BNB_QMAP_BYTES} B",
                  source="bitsandbytes 0.50.2 optim/optimizer.py:Optimizer8bit.fill_qmap (create_dynamic_map)")
        t.alloc(QMAPS_HOST, BNB_QMAP_BYTES)
        t.alloc(QMAPS_HOST, BNB_QMAP_BYTES)
