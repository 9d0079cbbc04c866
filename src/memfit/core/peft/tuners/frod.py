"""FRoD: each adapted weight rebuilt as ``U (S + diag(lambda)) V.T`` from a basis ``V (in, in)`` shared by
the modules of one role ("category") across the blocks, a trained diagonal ``lambda`` and the trained
values of a fixed sparse ``S`` (peft 0.21.2 ``tuners/frod/``: ``FrodModel._init_frod_projections``,
``_category_from_key``, ``FrodLayer.update_layer``)."""

from __future__ import annotations

from memfit.core.model import BufferSpec, ModelShape
from memfit.core.peft.inject import ROOT, AdapterTensor, inject
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.spec import PeftSpec
from memfit.core.peft.targets import find_targets
from memfit.core.peft.tuners import defaults
from memfit.core.peft.tuners.base import (FAN_IN_FAN_OUT, INIT, LAYERS, LAYERS_PATTERN, MODULES_TO_SAVE, TARGETS, Settings,
                                          Tuner, bias_key, free, keys, only, require, sized)


def category(module: str) -> str:
    """``_category_from_key``: the module's last name, with its parent's unless that is a block index
    (``self_attn_q_proj``, ``mlp_down_proj``); BERT's ``attention.output.dense`` is ``attention_output``."""
    parts = module.split(".")
    if len(parts) == 1:
        return parts[0]
    if parts[-2].isdigit():
        return parts[-1]
    name = f"{parts[-2]}_{parts[-1]}"
    if name == "output_dense" and len(parts) >= 3 and parts[-3] == "attention":
        return "attention_output"
    return name


def sparse_count(in_dim: int, rate: float) -> int:
    """The sparse ``S``'s entries (``_init_frod_projections``): ``min(int(in * in * sparse_rate), off-diagonal
    entries)``, at least 1 when ``sparse_rate > 0`` and there is an off-diagonal entry."""
    off = in_dim * in_dim - in_dim
    nnz = min(int(in_dim * in_dim * rate), off)
    if rate > 0 and off > 0:
        nnz = max(1, nnz)
    return nnz


def build_frod(shape: ModelShape, spec: PeftSpec, s: Settings) -> ModelShape:
    """The layers get ``frod_lambda_l (in,)``, ``frod_lambda_s_values (nnz,)`` (in that order: the
    ``ParameterDict``s of ``FrodLayer.__init__``) and the non-persistent buffer ``frod_U (out, in)`` (the base
    weight's dtype: ``update_layer`` and ``FrodModel._cast_adapter_dtype``). ``FrodModel`` itself holds, per
    category in sorted order, ``frod_V.<c> (in, in)`` (``_projection_from_weights``: an SVD's ``vh.T`` or
    ``R.T @ eigenvectors``, square either way; the weights' dtype), ``frod_s_indices.<c> (2, nnz)`` and
    ``frod_s_size.<c> (2,)`` (int64), persistent iff ``save_projection``; registered after the model, so
    ``named_buffers()`` meets them last, all the ``frod_V`` first."""
    rate = s["sparse_rate"]
    require(0 <= rate <= 1, f"`sparse_rate` should be between 0 and 1, got {rate}.")
    layers = find_targets(shape, spec, what="FROD", defaults=defaults.FROD, kinds=frozenset({"linear", "conv1d"}))
    widths: dict[str, int] = {}
    for layer in layers:
        c = category(layer.module)
        # torch.cat of the category's (out, in) weights along dim 0 fails on another width
        require(widths.setdefault(c, layer.in_features) == layer.in_features,
                f"FROD: the {c!r} modules have different input widths ({widths[c]} and {layer.in_features}); peft's "
                "_projection_from_weights cannot stack them")
    at = f".{ADAPTER_NAME}"

    def tensors(layer):  # noqa: ANN001, ANN202
        i = layer.in_features
        return [AdapterTensor("frod_lambda_l" + at, (i,)),
                AdapterTensor("frod_lambda_s_values" + at, (sparse_count(i, rate),)),
                AdapterTensor("frod_U" + at, (layer.out_features, i), buffer="fp32", persistent=False,
                              follows_weight=True)]

    out = inject(shape, spec, layers, tensors, what="FROD", bias=s["bias"])
    keep = bool(s["save_projection"])
    base = ROOT.removesuffix("model.")
    cats = sorted(widths)
    extra = [*(BufferSpec(f"{base}frod_V.{c}{at}", (widths[c], widths[c]), "fp32", keep, True) for c in cats),
             *(BufferSpec(f"{base}frod_s_indices.{c}{at}", (2, sparse_count(widths[c], rate)), "int64", keep) for c in cats),
             *(BufferSpec(f"{base}frod_s_size.{c}{at}", (2,), "int64", keep) for c in cats)]
    return out.with_buffers((*out.buffers, *extra))


TUNER = Tuner(
    peft_type="FROD", method="frod", prefix="frod_", source="peft/tuners/frod/model.py:FrodModel._init_frod_projections, "
    "layer.py:FrodLayer.update_layer",
    targets=defaults.FROD, bias=True,
    keys=keys(
        target_modules=TARGETS,
        projection_prng_key=free("int", 0, "seed of the sparse pattern"),
        save_projection=sized("bool", True, "the shared V and S pattern are persistent buffers (in the state dict)"),
        frod_dropout=sized("float", 0.0, "dropout on the input: the base layer then runs beside the rebuilt one"),
        fan_in_fan_out=FAN_IN_FAN_OUT, bias=bias_key("frod_"), modules_to_save=MODULES_TO_SAVE, init_weights=INIT,
        layers_to_transform=LAYERS, layers_pattern=LAYERS_PATTERN,
        sparse_rate=sized("float", 0.01, "share of S's off-diagonal entries trained"),
        regularization_alpha=free("float", 1e-3, "stabilizes the basis' inverse at build time"),
        progressbar=free("bool", True, "a progress bar while the bases are built"),
        runtime_offload_base_weight=only(False, "keeps the adapted layers' base weights on the CPU while FRoD runs "
                                         "without them", "bool"),
    ),
    build=build_frod,
)
