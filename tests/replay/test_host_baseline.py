"""The host-process figures memfit ships (src/memfit/core/ledger/host_process_measured.json) are
what this machine measures now: a fresh process importing torch, and a DataLoader worker iterating
the smaller in-memory dataset (``memfit.replay.host_baseline``).

Tolerances: RSS of the same imports differs between runs by the libraries' lazily touched pages
(a few MB of 229 MB here): 10%; a worker's private pages depend on which of the parent's pages
its iteration touched first: 20%."""

from __future__ import annotations

import pytest

from memfit.core.ledger import host_process as hp


@pytest.mark.slow
def test_import_torch_rss_matches_the_fixture():
    from memfit.replay.host_baseline import IMPORTS, _run

    now = _run(IMPORTS["torch"] + "\nprint(json.dumps({'rss': rss()}))")["rss"]
    shipped = hp.measured()["imports_rss"]["torch"]
    assert abs(now - shipped) / shipped <= 0.10, (now, shipped)


@pytest.mark.slow
def test_dataloader_worker_private_bytes_match_the_fixture():
    from memfit.replay.host_baseline import WORKERS, _run

    row = min(hp.measured()["dataloader_workers"].values(), key=lambda r: r["samples"])
    now = _run(WORKERS.format(samples=row["samples"], seq=row["seq_len"]))
    for got, shipped in zip(now["private"], row["worker_private"]):
        assert abs(got - shipped) / shipped <= 0.20, (got, shipped)
