"""The attention transformers builds by default, per release (``memfit.core.stack.attention`` and its
generated table ``sdpa_releases.py``), against the released code.

From wheels fetched from PyPI with their sha256 pinned (``tests/sdist_source.py``): 4.35.0 (no
``attn_implementation`` yet; Falcon calls ``F.scaled_dot_product_attention`` itself), 4.36.0 (the
dispatch, ``is_torch_sdpa_available`` at torch 2.1.1; Llama and Falcon set ``_supports_sdpa``, GPT-2
does not), 4.42.0 (GPT-2 and GPT-NeoX do), 4.51.0 and 5.0.0 (T5 and GPT-J do not; 5.x gives sdpa
whatever torch). Each family's modeling file is read for ``_supports_sdpa = True`` and compared with
the table; the installed release's classes are compared with it too, by their attribute."""

import re
import zipfile

import pytest

from memfit.core.families import FAMILIES
from memfit.core.stack.attention import class_supports_sdpa, default_attention

VERSIONS = ("4.35.0", "4.36.0", "4.42.0", "4.51.0", "5.0.0")
MODULE_DIR = {"deberta-v2": "deberta_v2", "gemma3_text": "gemma3", "llama4_text": "llama4"}
UTILS = "transformers/utils/import_utils.py"


def _modeling(model_type: str) -> str:
    d = MODULE_DIR.get(model_type, model_type)
    return f"transformers/models/{d}/modeling_{d}.py"


@pytest.fixture(scope="module")
def wheels(request, tmp_path_factory):
    from conftest import sdist_cache
    from sdist_source import SourceUnavailable, wheel_files

    out = {}
    cache = sdist_cache(request, tmp_path_factory)
    for v in VERSIONS:
        try:
            wheel_files("transformers", v, (UTILS,), cache)
        except SourceUnavailable as e:
            pytest.fail(f"transformers {v}'s wheel is needed to check memfit's attention rule: {e}", pytrace=False)
        with zipfile.ZipFile(cache / f"transformers-{v}-wheel" / "wheel.whl") as z:
            names = set(z.namelist())
            out[v] = {m: z.read(m).decode("utf-8") for m in [UTILS] + [_modeling(t) for t in FAMILIES]
                      if m in names}
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_supports_sdpa_table_matches_the_release(wheels, version):
    line = ".".join(version.split(".")[:2])
    for model_type in sorted(FAMILIES):
        src = wheels[version].get(_modeling(model_type))
        if src is None:
            assert class_supports_sdpa(model_type, line) is None, model_type  # not in that release
            continue
        sets = bool(re.search(r"_supports_sdpa\s*(?::\s*bool\s*)?=\s*True", src))
        assert class_supports_sdpa(model_type, line) is sets, (version, model_type)


@pytest.mark.parametrize("version", VERSIONS)
def test_default_attention_follows_the_release_dispatch(wheels, version):
    line = ".".join(version.split(".")[:2])
    utils = wheels[version][UTILS]
    has_check = "def is_torch_sdpa_available" in utils
    needs_211 = 'version.parse(_torch_version) >= version.parse("2.1.1")' in utils
    for model_type in sorted(FAMILIES):
        src = wheels[version].get(_modeling(model_type))
        if src is None:
            continue
        new, _ = default_attention(model_type, line, "2.13.0")
        old, _ = default_attention(model_type, line, "2.1.0")
        if not has_check:
            if line.startswith("4."):  # before the dispatch: each file's own attention
                calls = "F.scaled_dot_product_attention(" in src
                assert new == ("sdpa" if calls else "eager"), (version, model_type)
                assert old == new
            else:  # 5.x: sdpa where the class supports it, any torch transformers installs with
                assert new == old == ("sdpa" if class_supports_sdpa(model_type, line) else "eager")
            continue
        assert needs_211, version
        assert new == ("sdpa" if class_supports_sdpa(model_type, line) else "eager"), (version, model_type)
        assert old == "eager", (version, model_type)  # torch 2.1.0 < 2.1.1


def test_installed_release_classes_match_the_table():
    transformers = pytest.importorskip("transformers")
    import importlib

    from transformers import PreTrainedModel

    line = ".".join(transformers.__version__.split(".")[:2])
    for model_type in sorted(FAMILIES):
        d = MODULE_DIR.get(model_type, model_type)
        mod = importlib.import_module(f"transformers.models.{d}.modeling_{d}")
        classes = [c for c in vars(mod).values() if isinstance(c, type) and issubclass(c, PreTrainedModel)
                   and c.__module__ == mod.__name__]
        assert classes, model_type
        supports = any(c._supports_sdpa for c in classes)
        assert class_supports_sdpa(model_type, line) is supports, (transformers.__version__, model_type)
