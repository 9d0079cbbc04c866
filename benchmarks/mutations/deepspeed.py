"""Mutations of the DeepSpeed ledger, the activation model, the PEFT accounting and the DeepSpeed
config reading; and the real bugs no measurement here can see (``UNOBSERVABLE_MUTATIONS``)."""

from __future__ import annotations

from mutations.model import Mutation
from mutations.selections import PLAN_VS_REPLAY, SUB_GROUPS, ANALYTIC_VS_TRACE, PEFT_LIBRARY, DS_CONFIG

L, Z3, Z12, ST = ("src/memfit/core/ledger/deepspeed/load.py", "src/memfit/core/ledger/deepspeed/zero3.py",
                  "src/memfit/core/ledger/deepspeed/zero012.py", "src/memfit/core/ledger/deepspeed/step.py")
ACT, DSS = "src/memfit/core/activations/analytic.py", "src/memfit/core/frameworks/deepspeed.py"
LORA, PROMPT = "src/memfit/core/peft/lora.py", "src/memfit/core/peft/prompt_learning.py"
ACTC = "src/memfit/core/activations/common.py"
DSV, DSA, Z3F = ("src/memfit/core/dsconfig/validate.py", "src/memfit/core/dsconfig/auto.py",
                 "src/memfit/core/ledger/deepspeed/zero3_fetch.py")
STEP_COPY_FIND = """                t.alloc(STEP_TMP, n * 4)
                if fb != 4:
                    t.free(STEP_FLAT, n * fb)
                if z.stage in (1, 2):  # free_grad_in_param_list: the kept gradients go before the step
                    t.free(GRADS)
                    t.free(GRADS_PART)
            if first:  # one tensor per state (exp_avg, exp_avg_sq: torch's _init_group, DeepSpeedCPUAdam)
                for _ in range(k):
                    t.alloc(OPT_STATES, n * 4)
            if gpu_temps and z.stage == 0:  # FP16_Optimizer: fp32 copy of the flat gradient
                t.alloc(STEP_TMP, n * 4)
            if gpu_temps:
                t.free(STEP_TMP, n * 4)
"""
STEP_COPY_DROPPED = STEP_COPY_FIND.replace("                t.alloc(STEP_TMP, n * 4)\n                if fb", "                if fb", 1
                                           ).replace("            if gpu_temps:\n", "            if gpu_temps and z.stage == 0:\n")
"""ZeRO-1/2/3's fp32 copy of the gradient partition in the step, dropped (its alloc and its free)."""

MUTATIONS: tuple[Mutation, ...] = (
    # ---- the ledger (deterministic DeepSpeed allocations) -------------------------------------------
    Mutation("ds-buffer-plus-one", "ledger", Z3, "t.alloc(IPG, z.reduce_bucket_size * ctx.comm_bytes)",
             "t.alloc(IPG, (z.reduce_bucket_size + 1) * ctx.comm_bytes)", PLAN_VS_REPLAY,
             "one DeepSpeed buffer +1 element: the reduce bucket read off stage3.ipg_buckets"),
    Mutation("pinned-flag-flipped", "ledger", Z3, "opt_pin = off_opt and z.offload_optimizer.pin_memory",
             "opt_pin = off_opt and not z.offload_optimizer.pin_memory", PLAN_VS_REPLAY,
             "a pinned flag flipped: the gradient buffers booked pageable; the replay saw them pass pin_memory"),
    Mutation("param-partitions-unpinned", "ledger", Z3, 'pinned = off != "none" and z.offload_param.pin_memory',
             'pinned = off != "none" and not z.offload_param.pin_memory', PLAN_VS_REPLAY,
             "offload_param's pin flag ignored for the parameter partitions"),
    Mutation("staging-copy-dropped-step", "ledger", ST, STEP_COPY_FIND, STEP_COPY_DROPPED, PLAN_VS_REPLAY,
             "a staging copy dropped: the step's fp32 copy of the gradient partition "
             "(stage_1_and_2.py step: flat_grad_partition.to(fp32); stage3.py: the flat partition's .to(fp32))"),
    Mutation("partition-floor", "ledger", "src/memfit/core/ledger/context.py",
             "return ceil_div(p.numel, self.world)", "return p.numel // self.world", PLAN_VS_REPLAY,
             "ZeRO-3 partitions rounded down instead of ceil(p/W)"),
    Mutation("fp16-flat-fp32", "ledger", Z3, "pin(t, FP16_FLAT, in_cpu * nb, new)", "pin(t, FP16_FLAT, in_cpu * 4, new)",
             PLAN_VS_REPLAY, "the flat 16-bit partitions booked at 4 bytes per element"),
    Mutation("master-2-bytes", "ledger", Z3, "t.alloc(FP32, n * 4)", "t.alloc(FP32, n * 2)", PLAN_VS_REPLAY,
             "fp32 master weights at 2 bytes per element"),
    Mutation("init-grad-buffer-half", "ledger", Z3, "t.alloc(INIT_GRAD_BUF, largest * 4)",
             "t.alloc(INIT_GRAD_BUF, largest * 2)", PLAN_VS_REPLAY,
             "initialize_optimizer_states' temporary gradient buffer at half size (a transient)"),
    Mutation("zero2-alignment", "ledger", Z12, "    align = 2 * ctx.world", "    align = ctx.world", PLAN_VS_REPLAY,
             "ZeRO-1/2's flat buffer aligned to W instead of 2W elements"),
    Mutation("temp-grad-buffer-plus-one", "ledger", Z12, "pin(t, TEMP_CPU, p_max * nb, opt_pin)",
             "pin(t, TEMP_CPU, (p_max + 1) * nb, opt_pin)", PLAN_VS_REPLAY,
             "the host gradient staging buffer +1 element"),
    Mutation("offload-16bit-unpinned", "ledger", Z12,
             't.declare(OFFLOAD_16, name="16-bit host copy of the partition", device=host(opt_pin)',
             't.declare(OFFLOAD_16, name="16-bit host copy of the partition", device=host(False)', PLAN_VS_REPLAY,
             "ZeRO-2's 16-bit host partition booked pageable"),
    Mutation("adapters-16-bit", "ledger", L,
             '        t.alloc(HOST_ADAPTERS, n_ad * 4)\n        for p in adapters:\n            where[p.name] = (HOST_ADAPTERS, "fp32")',
             '        t.alloc(HOST_ADAPTERS, n_ad * 2)\n        for p in adapters:\n            where[p.name] = (HOST_ADAPTERS, "fp16")',
             PLAN_VS_REPLAY,
             "PEFT-created weights loaded at 2 bytes (peft creates them in fp32)"),
    Mutation("buffers-dropped", "ledger", L, "    t.alloc(HOST_BUFFERS, m.buffer_bytes)", "    pass", PLAN_VS_REPLAY,
             "module buffers (rotary tables) left out of the load"),
    Mutation("cast-no-op-counted", "ledger", L, "        if dtype == sc.deepspeed.precision:\n            continue",
             "        if False:\n            continue", PLAN_VS_REPLAY,
             "a param already in the training dtype counted as cast (.to() returns the same tensor)"),
    Mutation("persistence-strict", "ledger", Z3F, "if n <= param_threshold if inclusive else n < param_threshold:",
             "if n < param_threshold if inclusive else n < param_threshold:", PLAN_VS_REPLAY,
             "0.19's persistence threshold read as < instead of <="),
    Mutation("states-half", "ledger", ST, "for _ in range(k):\n                    t.alloc(OPT_STATES, n * 4)",
             "for _ in range(k):\n                    t.alloc(OPT_STATES, n * 2)",
             PLAN_VS_REPLAY, "Adam states at 2 bytes per element"),
    Mutation("grads-kept-through-step", "ledger", ST, "                    t.free(GRADS_PART)\n", "                    pass\n",
             PLAN_VS_REPLAY, "ZeRO-1/2's gradient partition kept through the optimizer step (stage_1_and_2.py step: "
             "free_grad_in_param_list frees it before the optimizer runs)"),
    Mutation("save-fp32", "ledger", ST, "t.alloc(SAVE_HOST, ctx.n_total * nb)", "t.alloc(SAVE_HOST, ctx.n_total * 4)",
             PLAN_VS_REPLAY, "the consolidated 16-bit state dict booked at 4 bytes per element"),
    Mutation("cpu-pins-copy", "ledger", "src/memfit/core/ledger/timeline.py", 'return self.accelerator == "cuda"',
             "return True", PLAN_VS_REPLAY, "pin_memory() copying on the CPU accelerator, where it returns its input"),
    Mutation("sub-group-strict", "ledger", Z3, "if cur >= sg_size or i == len(parts) - 1:",
             "if cur > sg_size or i == len(parts) - 1:", SUB_GROUPS,
             "sub groups closed one param late (vs DeepSpeed's _create_fp16_sub_groups)"),
    # ---- activations -------------------------------------------------------------------------------------
    Mutation("activations-plus-1pct", "activations", ACT, "        total_bytes=total,",
             "        total_bytes=total * 101 // 100,", ANALYTIC_VS_TRACE, "activations +1% (vs the traced model code)"),
    Mutation("logits-fp16-loss", "activations", ACT, "+ 4 * t * arch.vocab_size\n", "+ 2 * t * arch.vocab_size\n",
             ANALYTIC_VS_TRACE, "the loss's fp32 log-softmax booked in 16 bits"),
    Mutation("eager-scores-dropped", "activations", ACTC,
             "probs = softmax_bytes * b * a * s * skv + (D * b * a * s * skv if softmax_bytes != D else 0)",
             "probs = softmax_bytes * b * a * s * skv", ANALYTIC_VS_TRACE,
             "eager attention's 16-bit copy of the probabilities left out"),
    Mutation("sdpa-logsumexp-dropped", "activations", ACTC, "+ D * t * hq + 4 * b * a * s\n", "+ D * t * hq\n",
             ANALYTIC_VS_TRACE, "sdpa's saved logsumexp (fp32, per query and head) left out"),
    Mutation("lora-dimension-plus-one", "peft", LORA, 'ParamSpec(at % "lora_A" + ".weight", (r, in_features), not spec.lora_fa),',
             'ParamSpec(at % "lora_A" + ".weight", (r + 1, in_features), not spec.lora_fa),', PEFT_LIBRARY + PLAN_VS_REPLAY,
             "one LoRA dimension +1 (vs peft's model and the replays' trainable bytes)"),
    Mutation("prefix-bias-dropped", "peft", PROMPT, '        ParamSpec(at + "transform.0.bias", (h,)),\n', "",
             PEFT_LIBRARY + PLAN_VS_REPLAY, "the prefix encoder's first bias left out"),
    Mutation("prefix-token-dim-hidden", "peft", PROMPT, "        token_dim = arch.head_dim * arch.num_kv_heads",
             "        token_dim = arch.hidden_size", PEFT_LIBRARY,
             "prefix width from hidden_size on grouped-query models (peft #1901)"),
    Mutation("prompt-rows-single", "peft", PROMPT, "rows = spec.num_virtual_tokens * dims.num_transformer_submodules",
             "rows = spec.num_virtual_tokens", PEFT_LIBRARY,
             "prompt tuning's embedding without the encoder-decoder's second submodule"),
    Mutation("lora-bias-all-ignored", "peft", LORA, 'is_bias and spec.lora_bias == "all"), []))', "False), []))",
             PEFT_LIBRARY, "lora_bias='all' not training the biases of layers LoRA does not adapt"),
    # ---- DeepSpeed config reading ---------------------------------------------------------------------------
    Mutation("default-bucket", "config", DSV, 'DsField("reduce_bucket_size", I, 500_000_000, gt=0)',
             'DsField("reduce_bucket_size", I, 500_000_001, gt=0)', DS_CONFIG,
             "DeepSpeed's default reduce_bucket_size off by one (the parser's field table)"),
    Mutation("default-persistence", "config", DSV, 'DsField("param_persistence_threshold", I, 100_000,',
             'DsField("param_persistence_threshold", I, 10_000,', DS_CONFIG,
             "default stage3_param_persistence_threshold (the parser's field table)"),
    Mutation("settings-default-bucket", "config", DSS, "reduce_bucket_size: int = 500_000_000",
             "reduce_bucket_size: int = 500_000_001", DS_CONFIG,
             "ZeroSettings()'s own default (what memfit assumes when no JSON was read)"),
    Mutation("default-pin", "config", DSS, "    pin_memory: bool = True", "    pin_memory: bool = False", DS_CONFIG,
             "offload pin_memory default"),
    Mutation("auto-prefetch", "config", DSA, "int(0.9 * h * h)", "int(h * h)", DS_CONFIG,
             "'auto' stage3_prefetch_bucket_size filled as h^2 instead of 0.9 h^2 (transformers' Trainer)"),
    Mutation("auto-persistence", "config", DSA, '"zero_optimization.stage3_param_persistence_threshold", 10 * h,',
             '"zero_optimization.stage3_param_persistence_threshold", h,', DS_CONFIG,
             "'auto' persistence threshold filled as h instead of 10 h"),
)


UNOBSERVABLE_MUTATIONS: tuple[Mutation, ...] = (
    Mutation("staging-copy-dropped-fp32", "ledger", Z3, "t.alloc(FP32_TMP, n * tmp_bytes)", "pass",
             PLAN_VS_REPLAY, "a staging copy dropped: the .to(fp32) temporary before the master's clone()"),
    Mutation("staging-copy-dropped-defrag", "ledger", Z3, "t.alloc(DEFRAG_TMP, n_part * nb)", "pass",
             PLAN_VS_REPLAY, "a staging copy dropped: defragment()'s host copy (ZeRO-3 without param offload)"),
    Mutation("staging-copy-dropped-clone", "ledger", Z12, "t.alloc(CLONE_TMP, part * nb)", "pass",
             PLAN_VS_REPLAY, "a staging copy dropped: ZeRO-1/2's 16-bit clone before the fp32 master"),
    Mutation("lora-rank-activation", "activations", ACT, "* D * t * peft.lora_r if method", "* D * t * (peft.lora_r + 1) if method",
             ANALYTIC_VS_TRACE, "LoRA's saved rank-r intermediate one wider"),
    # ---- PEFT accounting ------------------------------------------------------------------------------------
)
"""Real bugs that no measurement here can see, kept out of the score (run them with
``--include-unobservable``; each survives). The three DeepSpeed staging copies are transients of
initialize: in every replay fixture the phase's peak comes later, at an equal or larger buffer (the
fp32 conversion temporary is exactly masked by initialize_optimizer_states' gradient buffer of the
largest sub group; the defragment host copy and the ZeRO-1/2 16-bit clone by the fp32 masters), so
dropping one changes no phase peak of any of the 21 fixtures (checked: the plan's peaks are
identical with and without each). Catching them needs a replay that marks the inside of
``deepspeed.initialize`` (a seam after ``_create_fp32_partitions``) and re-recorded fixtures. The
LoRA rank-r intermediate is D x tokens x r bytes per adapted projection, about 1e-4 of a layer's
activations; one rank more is far below the analytic model's stated precision (0.5% against the
trace), the only comparison it has."""
