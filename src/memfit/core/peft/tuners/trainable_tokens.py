"""Trainable tokens: only the given rows of the embedding train, as a delta beside a frozen copy of the
original rows (peft 0.21 ``tuners/trainable_tokens/``: ``TrainableTokensLayer.update_layer``; the
default target is the input embedding, ``_get_input_embeddings_name``). A head tied to the embedding
is wrapped too but shares the same delta (no new tensor)."""

from __future__ import annotations

from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners.base import INIT, Settings, Tuner, keys, require, sized


def trainable_tokens_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """``trainable_tokens_delta (n, dim)`` and the non-persistent fp32 ``trainable_tokens_original (n, dim)``
    (``dim``: the embedding width, or a Linear's ``in_features``)."""
    n = len(s["token_indices"] or ())
    dim = layer.out_features if layer.kind == "embedding" else layer.in_features
    at = f".{ADAPTER_NAME}"
    return [AdapterTensor("trainable_tokens_delta" + at, (n, dim)),
            AdapterTensor("trainable_tokens_original" + at, (n, dim), buffer="fp32", persistent=False)]


class _InputEmbedding(dict):
    """Default targets: the input embedding's module name (``_get_input_embeddings_name(model,
    "embed_tokens")``, the name of ``get_input_embeddings()``) per model type; ``embed_tokens`` else."""

    NAMES = {"gpt2": "wte", "gptj": "wte", "bloom": "word_embeddings", "falcon": "word_embeddings",
             "gpt_neox": "embed_in", "t5": "shared", "mt5": "shared", "umt5": "shared", "bert": "word_embeddings",
             "roberta": "word_embeddings", "deberta-v2": "word_embeddings"}

    def get(self, model_type, default=None):  # noqa: ANN001
        return (self.NAMES.get(model_type, "embed_tokens"),)


def _check(layer: Layer, s: Settings) -> None:
    require(s["token_indices"] is not None, "token_indices must be a list of token ids")


TUNER = Tuner(
    peft_type="TRAINABLE_TOKENS", method="trainable_tokens", prefix="trainable_tokens_",
    source="peft/tuners/trainable_tokens/layer.py:TrainableTokensLayer.update_layer",
    targets=_InputEmbedding(), kinds=frozenset({"embedding", "linear"}),
    keys=keys(
        token_indices=sized("list", [], "the token rows that train"),
        target_modules=sized("str_or_list", None, "the embedding(s) adapted (default: the input embedding)"),
        init_weights=INIT,
    ),
    tensors=trainable_tokens_tensors, check=_check,
)
