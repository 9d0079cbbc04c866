"""``memfit compare``: a plan against the records of a real run (pure: no torch).

``reconcile(plan, read_records(paths))`` -> ``Reconciliation`` (see ``types``).
"""

from memfit.core.compare.reconcile import reconcile
from memfit.core.compare.types import Reconciliation

__all__ = ["Reconciliation", "reconcile"]
