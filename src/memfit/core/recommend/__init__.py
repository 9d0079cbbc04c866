"""``memfit recommend``: search the configurations a user can change for those that fit, ranked.

- ``deepspeed/space``: the settings and values searched (``Candidate``, ``SearchSpace``);
- ``deepspeed/aggregates``: sums over the parameters, computed once per scenario;
- ``deepspeed/estimate``: per-phase peaks from the aggregates, equal to the exact ledger's;
- ``step_time``: an estimate of the step time, to rank what fits;
- ``patch`` and ``script_diff``: the candidate as edits to the user's DeepSpeed JSON and script;
- ``search``: which framework's search runs: ``deepspeed/search.py`` (the search, the ranking and
  the confirmation by the exact ledger) or ``pytorch/search.py`` for runs outside DeepSpeed;
- ``confirm``: the limits with headroom and the exact ledger's check against them;
- ``results``: ``Recommendation`` and ``RecommendResult``, what both searches return;
- ``files``: writing the results to a directory, never over an existing file.
"""

from memfit.core.recommend.deepspeed.search import prepare
from memfit.core.recommend.results import Recommendation, RecommendResult
from memfit.core.recommend.search import recommend

__all__ = ["RecommendResult", "Recommendation", "prepare", "recommend"]
