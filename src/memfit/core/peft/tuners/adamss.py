"""AdaMSS: each adapted weight's (plus its bias column's) SVD to rank ``r``, its output rows clustered by
KMeans into ``num_subspaces`` subspaces, each trained as a rank-``subspace_rank`` ``B_i A_i`` (peft 0.21.2
``tuners/adamss/``: ``AdamssLayer.update_layer``, ``utils.slice_pca``, ``utils.clustering_Z``).

What a config file alone determines, read from ``update_layer``:

- ``r_eff = min(r, out, in + bias)`` (``utils.py:38``), ``K = min(num_subspaces, out)`` subspaces
  (``utils.py:96``), the frozen projection ``adamss_newB (r_eff, in + bias)``, a persistent fp32 buffer, and every
  ``adamss_A.default.i`` ``(rank_i, r_eff)``;
- subspace ``i``'s rank is ``min(len(cluster_i), subspace_rank)`` (``layer.py:239``; with ``use_dynamic_rank``
  also capped by a count of singular values, ``layer.py:229-230``, which is at least one): at
  ``subspace_rank`` 1 every rank is 1 whatever the clusters, so the trained count is ``K r_eff + out`` per layer
  and every tensor the forward saves has a size the config gives. Above 1 the count depends on the cluster
  sizes, known only from the weights: refused.
- What the clustering still decides: how the ``out`` rows split among the ``adamss_B.default.i (len_i, 1)``.
  memfit plans them as equal splits (the first ``out mod K`` one row longer) and says so in the notes; the
  total is exact, and a split only moves a tensor's allocator rounding (<= 512 B per tensor).
"""

from __future__ import annotations

from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners import defaults
from memfit.core.peft.tuners.base import (LAYERS, LAYERS_PATTERN, MODULES_TO_SAVE, TARGETS, Settings, Tuner, free, keys,
                                          only, require, sized)

SPLIT_NOTE = ("ADAMSS: the rows of each adapted weight are split among its subspaces by KMeans over the weight's "
              "SVD (peft 0.21.2 tuners/adamss/layer.py:188), known only from the weights: memfit plans equal splits "
              "(adamss_B.default.i); the trained count per layer (num_subspaces x r + out rows) is exact")
"""Said in the plan's notes whenever ADAMSS is planned."""


def split(rows: int, parts: int) -> list[int]:
    """``rows`` as ``parts`` equal shares, the first ``rows mod parts`` one longer (memfit's stand-in for the
    KMeans clusters' sizes, whose sum is ``rows``)."""
    q, extra = divmod(rows, parts)
    return [q + 1 if i < extra else q for i in range(parts)]


def check(layer: Layer, s: Settings) -> None:
    require(s["r"] > 0, f"ADAMSS r must be a positive integer, got {s['r']} (peft's torch.svd_lowrank fails on it)")
    require(s["num_subspaces"] > 0, f"ADAMSS num_subspaces must be a positive integer, got {s['num_subspaces']} "
            "(peft's KMeans fails on it)")


def adamss_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """``adamss_A.default.i (1, r_eff)`` for each of the ``K`` subspaces, then ``adamss_B.default.i (len_i, 1)``
    (``ParameterList``s in ``ModuleDict``s, registered before the ``BufferDict``), then the persistent buffer
    ``adamss_newB.default (r_eff, in + bias)``: fp32 (the SVD's dtype, cast to the weight's; peft's
    ``cast_adapter_dtype`` upcasts a BufferDict's 16-bit entries back to fp32)."""
    o, i = layer.out_features, layer.in_features + (1 if layer.has_bias else 0)
    r_eff = min(s["r"], o, i)
    k = min(s["num_subspaces"], o)
    at = f".{ADAPTER_NAME}."
    out = [AdapterTensor(f"adamss_A{at}{j}", (1, r_eff)) for j in range(k)]
    out += [AdapterTensor(f"adamss_B{at}{j}", (rows, 1)) for j, rows in enumerate(split(o, k))]
    out.append(AdapterTensor(f"adamss_newB.{ADAPTER_NAME}", (r_eff, i), buffer="fp32"))
    return out


_RANK_WHY = ("subspace i's rank is min(its KMeans cluster's row count, subspace_rank) (peft 0.21.2 "
             "tuners/adamss/layer.py:239; with use_dynamic_rank the count of its Gram matrix's singular values above "
             "svd_threshold, layer.py:229-230): above 1 the shapes of adamss_A/adamss_B and the trained count depend "
             "on the cluster sizes, known only from the weights")
_ASA_WHY = ("ASA keeps four tensors the size of every adamss_A/adamss_B (exp_avg_ipt/unc, zeros_like in "
            "AdamssLayer.update_importance, layer.py:123-124) and freezes pruned subspaces during training: not "
            "modelled yet")
_ASA_ONLY = "read by the ASA schedule only (use_asa)"

TUNER = Tuner(
    peft_type="ADAMSS", method="adamss", prefix="adamss_",
    source="peft/tuners/adamss/layer.py:AdamssLayer.update_layer, utils.py:slice_pca, clustering_Z",
    targets=defaults.ADAMSS, kinds=frozenset({"linear"}),  # _create_new_module: torch.nn.Linear only (TypeError else)
    note=SPLIT_NOTE,
    keys=keys(
        r=sized("int", 100, "the SVD's rank, clamped to min(r, out, in + bias): adamss_A's width, adamss_newB's height"),
        num_subspaces=sized("int", 5, "K subspaces (clamped to out): K adamss_A and K adamss_B per layer"),
        subspace_rank=only(1, _RANK_WHY, "int"),
        target_modules=TARGETS,
        init_weights=free("any", "orthogonal", "B zeros or small random values: same shapes",
                          nullable=True, choices=("orthogonal", False)),
        modules_to_save=MODULES_TO_SAVE,
        layers_to_transform=LAYERS,
        layers_pattern=LAYERS_PATTERN,
        use_asa=only(False, _ASA_WHY, "bool"),
        asa_target_subspaces=free("int", 50, _ASA_ONLY),
        init_warmup=free("int", 50, _ASA_ONLY),
        final_warmup=free("int", 1000, _ASA_ONLY),
        mask_interval=free("int", 100, _ASA_ONLY),
        asa_importance_beta=free("float", 0.85, _ASA_ONLY),
        asa_uncertainty_beta=free("float", 0.85, _ASA_ONLY),
        asa_schedule_exponent=free("float", 3.0, _ASA_ONLY),
        use_dynamic_rank=free("bool", False, "caps each subspace's rank by a singular-value count that is at least 1 "
                              "(layer.py:229-233): no change at subspace_rank 1"),
        svd_threshold=free("float", 0.1, "use_dynamic_rank's threshold: no change at subspace_rank 1"),
        random_seed=free("int", 0, "seed of the randomized SVD"),
    ),
    tensors=adamss_tensors,
    check=check,
)
