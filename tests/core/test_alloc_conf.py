"""Torch versions and the strict PYTORCH_CUDA_ALLOC_CONF parser (limits from torch 2.13's parsers)."""

import pytest

from memfit.core.alloc.conf import MiB, SIZE_MAX, parse_alloc_conf
from memfit.core.alloc.versions import DEFAULT_TORCH, TORCH_VERSIONS, keys_for, resolve_torch_version
from memfit.errors import MemfitError


@pytest.mark.parametrize("text, name", [("2.13", "2.13"), ("2.13.0", "2.13"), ("2.13.0+cpu", "2.13"),
                                        ("1.10.1", "1.10"), (" 2.1 ", "2.1"), (None, DEFAULT_TORCH)])
def test_resolve_torch_version(text, name):
    assert resolve_torch_version(text).name == name


@pytest.mark.parametrize("bad", ["1.9", "3.0", "latest", "2", "2.x", ""])
def test_unknown_torch_version(bad):
    with pytest.raises(MemfitError, match="unknown torch version"):
        resolve_torch_version(bad)


def test_version_rules():
    v110, v111, v113, v213 = (resolve_torch_version(v) for v in ("1.10", "1.11", "1.13", "2.13"))
    assert not v110.pinned_power_of_two and v111.pinned_power_of_two
    assert not v111.cublas_workspace_in_allocator and v113.cublas_workspace_in_allocator
    assert "expandable_segments" not in keys_for(resolve_torch_version("2.0"))
    assert "expandable_segments" in keys_for(resolve_torch_version("2.1"))
    assert keys_for(v110) == ("max_split_size_mb",)
    assert v213.rules_read and not TORCH_VERSIONS["2.15"].rules_read


def test_defaults_and_values():
    v = resolve_torch_version("2.13")
    c = parse_alloc_conf("", v)
    assert c.max_split_size == SIZE_MAX and c.max_non_split_rounding == 20 * MiB and not c.expandable_segments
    c = parse_alloc_conf(" expandable_segments:True , max_split_size_mb:128,garbage_collection_threshold:0.6,"
                         "per_process_memory_fraction:0.9,pinned_reserve_segment_size_mb:64", v)
    assert c.expandable_segments and c.max_split_size == 128 * MiB
    assert c.garbage_collection_threshold == 0.6 and c.per_process_memory_fraction == 0.9
    assert c.pinned_reserve_segment_size == 64 * MiB


def test_roundup_list_form():
    c = parse_alloc_conf("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]", resolve_torch_version("2.13"))
    # the first entry fills the intervals below it; '>' fills from the last entry's interval on
    assert c.roundup_power2_divisions == (1,) * 9 + (2,) + (8,) * 6
    assert c.divisions_for(600 * MiB) == 2 and c.divisions_for(3 * MiB) == 1


def test_speed_only_options_are_accepted_and_said_out_loud():
    c = parse_alloc_conf("pinned_use_cuda_host_register:True,pinned_num_register_threads:8",
                         resolve_torch_version("2.13"))
    assert len(c.notes) == 2 and "not the bytes held" in c.notes[0]


@pytest.mark.parametrize("text, version, msg", [
    ("foo:1", "2.13", "unknown option 'foo'"),
    ("expandable_segments:True", "2.0", "not known to torch 2.0"),
    ("garbage_collection_threshold:0.5", "1.11", "not known to torch 1.11"),
    ("expandable_segments:true", "2.13", "True or False"),
    ("max_split_size_mb:19", "2.13", "too small, must be >= 20"),
    ("max_split_size_mb:abc", "2.13", "whole number"),
    ("max_split_size_mb", "2.13", "needs a value"),
    ("max_split_size_mb:100;expandable_segments:True", "2.13", "expected ','"),
    ("max_split_size_mb:100 expandable_segments:True", "2.13", "expected ','"),
    ("garbage_collection_threshold:1.0", "2.13", "in \\(0.0, 1.0\\)"),
    ("per_process_memory_fraction:0", "2.13", "per_process_memory_fraction"),
    ("large_segment_size_mb:10", "2.13", "must be > 10"),
    ("roundup_power2_divisions:3", "2.13", "power of 2"),
    ("roundup_power2_divisions:[100:2]", "2.13", "powers of 2"),
    ("roundup_power2_divisions:[256:2", "2.13", "without"),
    ("backend:cudaMallocAsync", "2.13", "does not simulate"),
    ("max_split_size_mb:[1,2]", "2.13", "one value"),
    (":True", "2.13", "expected an option name"),
])
def test_bad_conf_is_one_line(text, version, msg):
    with pytest.raises(MemfitError, match=msg) as e:
        parse_alloc_conf(text, resolve_torch_version(version))
    assert "\n" not in str(e.value)
