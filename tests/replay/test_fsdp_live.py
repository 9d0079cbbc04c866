"""FSDP2 in a real 2-rank gloo world under torchrun (slow): every rank's sharded params, sharded
gradients and optimizer states, read off the objects, equal the plan's byte for byte. Phase peaks
are compared within ``TOL_GLOO_REL`` (the deterministic comparison is the fake world's,
tests/replay/test_torch_plan_vs_replay.py). The save phase is rank 0's:
``get_model_state_dict(full_state_dict=True, cpu_offload=True)`` keeps the full state dict on rank 0
only, as the ledger's rank-0-only item says, so it is compared on rank 0 (rank 1's save is not:
observed +24%, +42% and +42% in three runs), within ``TOL_SAVE_REL``."""

import pytest

from memfit.core.plan import make_plan
from memfit.replay.compare import compare, scenario_of
from memfit.replay.pytorch.record_fixtures import case_spec
from memfit.replay.runner import run_replay_ranks

pytestmark = pytest.mark.slow
TOL_GLOO_REL = 0.05
"""Every phase but save, both ranks: ``fully_shard``'s DTensor and device-mesh bookkeeping at setup,
not modelled (as in the fake world), and gloo's temporaries. Worst observed -2.497% (setup,
-107,160 B, both ranks, 3 runs; the backward -0.40%, -0.67% since the loss's backward is planned); 2x that is 4.99%."""
TOL_SAVE_REL = 0.10
"""Rank 0's save: the gathered state dict of a real world drops each all-gathered tensor sooner than
the fake world's, which the ledger follows. Worst observed -4.959% (-512,464 B; 3 runs); 2x that is
9.92%."""


def test_fsdp2_two_rank_gloo_world_matches_the_plan():
    pytest.importorskip("torch")
    ms = run_replay_ranks(case_spec("llama_fsdp2_w2_fp32_adamw", launcher="torchrun"), timeout_s=900)
    assert len(ms) == 2
    for m in ms:
        assert m.ok, f"{m.error.kind} in {m.error.phase}: {m.error.message}\n{m.error.traceback}"
        c = compare(make_plan(scenario_of(m)), m)
        assert {"fsdp.sharded_params", "fsdp.sharded_grads", "optimizer.state.total"} <= {i.key for i in c.items}
        assert c.exact_items_match, [(i.key, i.diff_bytes) for i in c.items]
        for p in c.phases:
            print(f"rank {m.spec.rank} {p.phase}: {p.diff_bytes:+,} B ({p.rel_diff:+.1%})")
            if p.phase == "save":
                if m.spec.rank == 0:
                    assert abs(p.rel_diff) <= TOL_SAVE_REL, p.rel_diff
                continue
            assert abs(p.rel_diff) <= TOL_GLOO_REL, (m.spec.rank, p.phase, p.rel_diff)
