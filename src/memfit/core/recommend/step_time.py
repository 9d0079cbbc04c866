"""An estimate of the time of one optimizer step, to rank configurations that fit. Not a prediction.

The model adds three terms, with no overlap between them (DeepSpeed overlaps some communication
and offload traffic with compute, so absolute times are pessimistic; the ranking is what counts):

``compute``: FLOPs per GPU per step / (``MFU`` x the card's dense fp16/bf16 peak,
``GpuSpec.fp16_tflops``). FLOPs per token (Kaplan et al. 2020, "Scaling Laws", section 2.1;
Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters", eq. 3):
forward ``2N`` plus attention ``4 L s d_attn``; backward ``2N`` for the activation gradients (every
layer: PEFT methods backpropagate through the frozen model to reach their adapters, prefix tuning
through every layer) plus ``2 N_tr`` for the weight gradients plus ``8 L s d_attn``; gradient
checkpointing adds one more forward. Full fine-tuning gives the familiar ``6N``; a frozen param
costs ``4`` per token. fp32 training runs at ``FP32_SPEED`` of the 16-bit peak (TF32).

``communication`` per GPU, ring collectives at ``bus_bandwidth`` (``(W-1)/W x bytes`` for a
reduce-scatter or an all-gather, twice that for an all-reduce; ZeRO paper, Rajbhandari et al. 2020,
section 7), in the training dtype, plus ``COLLECTIVE_LATENCY_S`` per bucket:
- stage 0 and 1: gradients all-reduced (stage 1: reduce-scattered, then the updated params
  all-gathered) once per step: ``2 x N_tr``;
- stage 2: gradients reduce-scattered at every micro-step, params all-gathered once: ``(A + 1) x N_tr``;
- stage 3: non-persistent params all-gathered for the forward and the backward (and the recompute
  under checkpointing) and gradients reduce-scattered, every micro-step: ``A x (2 or 3) x N + A x N_tr``.

``offload``: host <-> GPU copies at ``PCIE_BYTES_PER_S`` (pinned) or ``PAGEABLE_FRACTION`` of it
(pageable), NVMe reads and writes at ``NVME_BYTES_PER_S`` per node shared by its ranks, and the CPU
optimizer at ``CPU_ADAM_ELEMENTS_PER_S`` per rank:
- optimizer offload: this rank's gradient partition to the host at every micro-step (stage 1: once),
  the updated 16-bit partition back once per step (not with param offload: the params live there);
  on NVMe the fp32 master and the optimizer states are also read and written once per step;
- param offload (stage 3): this rank's partition of every param copied up for each gather.

The constants are round figures from the DeepSpeed papers and vendor sheets, for ranking only.
"""

from __future__ import annotations


from memfit.core.lean_dataclass import dataclass
from memfit.core.ledger.context import DTYPE_BYTES, ceil_div
from memfit.core.recommend.deepspeed.aggregates import ScenarioAggregates
from memfit.core.recommend.deepspeed.space import Candidate

MFU = 0.40
"""Fraction of the card's dense 16-bit peak a training step achieves (model FLOPs utilization)."""
FP32_SPEED = 0.5
"""fp32 (TF32) matmul throughput relative to fp16/bf16 on cards with TF32 (Ampere and newer)."""
DEFAULT_TFLOPS = 100.0
"""Peak assumed for a GPU given only by its memory size (``2x24GiB``)."""
PCIE_BYTES_PER_S = 25e9
"""Host <-> GPU, pinned memory, PCIe 4.0 x16 (about 25 GB/s achieved of 32)."""
PAGEABLE_FRACTION = 0.5
"""Pageable copies go through a pinned bounce buffer: about half the pinned rate."""
NVME_BYTES_PER_S = 6e9
"""Per node, reads and writes together (two PCIe 4.0 NVMe drives; ZeRO-Infinity's figures are
higher with more drives)."""
CPU_ADAM_ELEMENTS_PER_S = 1e9
"""DeepSpeedCPUAdam (AVX-512, the cores one rank gets): elements updated per second."""
NVLINK_BUS_BYTES_PER_S = 150e9
"""Collective bus bandwidth within a node of NVLink cards (A100/H100/H200 class)."""
PCIE_BUS_BYTES_PER_S = 10e9
"""Collective bus bandwidth within a node of PCIe cards (consumer cards, L40S, T4, A10G)."""
INTER_NODE_BYTES_PER_S = 25e9
"""Per GPU across nodes (200 Gb/s InfiniBand or RoCE per GPU)."""
COLLECTIVE_LATENCY_S = 30e-6
"""Fixed cost of one collective call (one bucket)."""
NVLINK_CARDS = ("a100", "h100", "h200", "v100")


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTime:
    """Estimated seconds per optimizer step, by term (see the module docstring)."""

    compute_s: float
    communication_s: float
    offload_s: float
    tokens_per_step: int
    """Tokens per optimizer step over all GPUs (the global batch x the sequence length)."""

    @property
    def total_s(self) -> float:
        return self.compute_s + self.communication_s + self.offload_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.total_s if self.total_s else 0.0


def bus_bandwidth(agg: ScenarioAggregates) -> float:
    """Bytes/s per GPU for ring collectives: NVLink or PCIe within a node, the network across nodes."""
    hw = agg.scenario.hardware
    intra = NVLINK_BUS_BYTES_PER_S if hw.gpu.name.startswith(NVLINK_CARDS) else PCIE_BUS_BYTES_PER_S
    return min(intra, INTER_NODE_BYTES_PER_S) if hw.nodes > 1 else intra


def estimate_step_time(agg: ScenarioAggregates, c: Candidate) -> StepTime:
    """Seconds per optimizer step of candidate ``c`` (module docstring)."""
    sc = agg.scenario
    arch = sc.model.arch
    W = agg.world
    nb = DTYPE_BYTES[c.precision]
    seq = sc.train.seq_len
    A = c.grad_accum
    tokens_gpu = c.micro_batch * A * seq
    N, N_tr = agg.n_total, agg.n_trainable
    layers = arch.num_layers + arch.num_encoder_layers
    attn = 4 * layers * seq * arch.num_heads * arch.head_dim  # QK^T and AV, forward, per token
    fwd = 2 * N + attn
    flops_per_token = fwd + (2 * N + 2 * N_tr + 2 * attn) + (fwd if c.gradient_checkpointing else 0)
    tflops = sc.hardware.gpu.fp16_tflops or DEFAULT_TFLOPS
    speed = MFU * tflops * 1e12 * (FP32_SPEED if c.precision == "fp32" else 1.0)
    compute = tokens_gpu * flops_per_token / speed

    ring = (W - 1) / W if W > 1 else 0.0
    bw = bus_bandwidth(agg)
    n_tr_bytes = N_tr * nb
    if c.stage <= 1:
        volume = 2 * ring * n_tr_bytes
        calls = ceil_div(N_tr, c.reduce_bucket_size) * 2 if c.stage == 1 else 1
    elif c.stage == 2:
        volume = (A + 1) * ring * n_tr_bytes
        calls = (A + 1) * ceil_div(N_tr, c.reduce_bucket_size)
    else:
        gathered = max(N - agg.persistent_numel(c.param_persistence_threshold, sc.ds_version), 0)
        passes = 3 if c.gradient_checkpointing else 2
        volume = A * ring * (passes * gathered * nb + n_tr_bytes)
        calls = A * (passes * ceil_div(gathered, max(c.prefetch_bucket_size, 1)) + ceil_div(N_tr, c.reduce_bucket_size))
    communication = (volume / bw + calls * COLLECTIVE_LATENCY_S) if W > 1 else 0.0

    offload = 0.0
    R = agg.ranks_per_node
    nvme_bw = NVME_BYTES_PER_S / R
    n_part = agg.opt_summary(sc.ds_version).n_part if c.stage == 3 else ceil_div(N_tr, W) if c.stage else N_tr
    if c.offload_optimizer != "none" and c.stage >= 1:
        pcie = PCIE_BYTES_PER_S * (1.0 if c.pin_optimizer else PAGEABLE_FRACTION)
        grad_copies = 1 if c.stage == 1 else A
        up = 0 if c.offload_param != "none" else n_part * nb
        offload += (grad_copies * n_part * nb + up) / pcie + n_part / CPU_ADAM_ELEMENTS_PER_S
        if c.offload_optimizer == "nvme":
            states = agg.states_per_param(True)
            offload += 2 * n_part * 4 * (1 + states) / nvme_bw
    if c.offload_param != "none" and c.stage == 3:
        pcie = PCIE_BYTES_PER_S * (1.0 if c.pin_param else PAGEABLE_FRACTION)
        passes = 3 if c.gradient_checkpointing else 2
        moved = A * passes * agg.parts_total * nb
        offload += moved / pcie + (moved / nvme_bw if c.offload_param == "nvme" else 0.0)
    return StepTime(compute_s=compute, communication_s=communication, offload_s=offload,
                    tokens_per_step=tokens_gpu * W)
