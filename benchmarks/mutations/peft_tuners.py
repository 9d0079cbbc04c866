"""Mutations of the PEFT tuners beyond LoRA and prompt/prefix tuning (``core/peft/tuners/``): each changes
one shape, dtype or trainability rule of a tuner as peft 0.21 builds it. The comparison that must catch
them: ``tests/exact/test_every_tuner.py`` (each tuner's adapter_config.json, saved by peft itself, planned
by memfit and built by ``get_peft_model`` on tiny Llama and GPT-2 models with distinct widths: the same
parameters and buffers, name by name, shape by shape)."""

from __future__ import annotations

from mutations.model import Mutation
from mutations.selections import PEFT_TUNERS

T = "src/memfit/core/peft/tuners/"

PEFT_TUNER_MUTATIONS: tuple[Mutation, ...] = (
    Mutation("ia3-feedforward-as-output", "peft", T + "ia3.py",
             "shape = (1, layer.in_features) if is_feedforward(layer.module, s) else (layer.out_features, 1)",
             "shape = (layer.out_features, 1)", PEFT_TUNERS,
             "IA3's feedforward layers scaled on their output ((out, 1)) instead of their input ((1, in))"),
    Mutation("adalora-e-square", "peft", T + "adalora.py", 'AdapterTensor("lora_E" + at, (r, 1))',
             'AdapterTensor("lora_E" + at, (r, r))', PEFT_TUNERS, "AdaLoRA's singular values as an r x r matrix"),
    Mutation("adalora-ranknum-trained", "peft", T + "adalora.py", 'AdapterTensor("ranknum" + at, (1,), trainable=False)',
             'AdapterTensor("ranknum" + at, (1,))', PEFT_TUNERS, "AdaLoRA's ranknum counted as a trained parameter"),
    Mutation("loha-w2b-out", "peft", T + "lycoris.py", 'AdapterTensor("hada_w2_b" + at, (r, i))]',
             'AdapterTensor("hada_w2_b" + at, (r, o))]', PEFT_TUNERS, "LoHa's second B factor sized by the output"),
    Mutation("lokr-w2-transposed", "peft", T + "lycoris.py", 'AdapterTensor("lokr_w2" + at, (b, d))',
             'AdapterTensor("lokr_w2" + at, (d, b))', PEFT_TUNERS, "LoKr's w2 factor transposed"),
    Mutation("oft-rows-buffers-persistent", "peft", T + "orthogonal.py",
             'AdapterTensor(at + "rows", (n,), buffer="int64", persistent=False)',
             'AdapterTensor(at + "rows", (n,), buffer="int64", persistent=True)', PEFT_TUNERS,
             "OFT's index buffers saved with the adapter (peft registers them non-persistent)"),
    Mutation("boft-s-by-input", "peft", T + "orthogonal.py", 'AdapterTensor(f"boft_s.{ADAPTER_NAME}", (layer.out_features, 1))',
             'AdapterTensor(f"boft_s.{ADAPTER_NAME}", (layer.in_features, 1))', PEFT_TUNERS,
             "BOFT's scale vector sized by the input"),
    Mutation("hra-u-by-output", "peft", T + "orthogonal.py", 'AdapterTensor(f"hra_u.{ADAPTER_NAME}", (layer.in_features, r))',
             'AdapterTensor(f"hra_u.{ADAPTER_NAME}", (layer.out_features, r))', PEFT_TUNERS,
             "HRA's Householder vectors sized by the output"),
    Mutation("vera-lambda-b-by-input", "peft", T + "vera.py", 'AdapterTensor("vera_lambda_b" + at, (layer.out_features,))',
             'AdapterTensor("vera_lambda_b" + at, (layer.in_features,))', PEFT_TUNERS,
             "VeRA's lambda_b sized by the input"),
    Mutation("vblora-b-by-input", "peft", T + "vblora.py", 'AdapterTensor("vblora_logits_B" + at, (layer.out_features // vl, r, nv))',
             'AdapterTensor("vblora_logits_B" + at, (layer.in_features // vl, r, nv))', PEFT_TUNERS,
             "VB-LoRA's B logits sized by the input"),
    Mutation("miss-default-by-input", "peft", T + "miss.py", "    return (r, layer.out_features)\n",
             "    return (r, layer.in_features)\n", PEFT_TUNERS, "MiSS's block sized by the input"),
    Mutation("road-size-halved", "peft", T + "road.py", "size = layer.out_features * num // den",
             "size = layer.out_features * num // (2 * den)", PEFT_TUNERS, "RoAd's vectors half their size"),
    Mutation("trainable-tokens-original-kept", "peft", T + "trainable_tokens.py",
             'AdapterTensor("trainable_tokens_original" + at, (n, dim), buffer="fp32", persistent=False)',
             'AdapterTensor("trainable_tokens_original" + at, (n, dim), buffer="fp32", persistent=True)', PEFT_TUNERS,
             "trainable tokens' original rows saved with the adapter (a non-persistent buffer in peft)"),
    Mutation("p-tuning-mlp-no-middle", "peft", T + "prompts.py", "        widths = [(h, d), (h, h), (d, h)]",
             "        widths = [(h, d), (d, h)]", PEFT_TUNERS, "P-tuning's MLP encoder without its middle layer"),
    Mutation("waveft-spectrum-doubled", "peft", T + "fourier.py", 'AdapterTensor(f"waveft_spectrum.{ADAPTER_NAME}", (n,))',
             'AdapterTensor(f"waveft_spectrum.{ADAPTER_NAME}", (2 * n,))', PEFT_TUNERS,
             "WaveFT's spectrum booked as complex pairs (peft: n_frequency reals)"),
    Mutation("osf-u-high-when-square", "peft", T + "osf.py", "    if o > i:\n", "    if o >= i:\n", PEFT_TUNERS,
             "OSF's _osf_U_high buffer made for square layers too (peft: only when out > in)"),
    Mutation("ln-tuning-llama-final-norm-skipped", "peft", T + "defaults.py",
             "    'llama': ('input_layernorm', 'post_attention_layernorm', 'norm'),",
             "    'llama': ('input_layernorm', 'post_attention_layernorm'),", PEFT_TUNERS,
             "LN tuning's Llama default targets without the final norm (peft's table has it)"),
    Mutation("tuner-read-first-exclude-only", "peft", T + "read.py",
             '    elif exclude:\n        spec_fields["exclude_modules"] = tuple(exclude)',
             '    elif exclude:\n        spec_fields["exclude_modules"] = tuple(exclude)[:1]', PEFT_TUNERS,
             "only the first of exclude_modules honoured"),
    Mutation("tuner-rank-ignored", "peft", T + "base.py", "        self._values.update(dict(spec.settings))",
             '        self._values.update({k: v for k, v in spec.settings if k != "r"})', PEFT_TUNERS,
             "the adapter_config.json's r ignored by every tuner (peft's default rank planned)"),
    Mutation("adaption-prompt-gate-vector", "peft", T + "adaption_prompt.py",
             'ParamSpec(f"base_model.model.{module}.adaption_gate", (1,))',
             'ParamSpec(f"base_model.model.{module}.adaption_gate", (shape.arch.hidden_size,))', PEFT_TUNERS,
             "the adaption prompt's gate as a vector per hidden unit (peft: one scalar per layer)"),
)
"""PEFT tuners (src/memfit/core/peft/tuners/)."""
