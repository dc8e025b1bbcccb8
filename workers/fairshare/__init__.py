"""Fair share of a queue between jobs, tenants and priorities: which sub-agents are published
next (the window, ``scheduler.py``, whose docstring argues the design), the pump that keeps it
full (``pump.py``) and tenants' token budgets (``budgets.py``).

Calls from outside the fleet (``drover gateway``'s) take places in the same window by
their tenant (``calls.py``).

A scheduler beside the limiter, not part of the job store: it reads the store (records in,
jobs ended) and the workers' liveness, and knows no Celery (its callers publish what it
grants)."""

from drover.workers.fairshare.budgets import tenant_budget_scopes
from drover.workers.fairshare.calls import CallPlaces
from drover.workers.fairshare.pump import pump_once, start_pump
from drover.workers.fairshare.scheduler import (
    CALLS_PREFIX,
    ORPHAN_GRANT_S,
    PUMP_S,
    Dispatch,
    FairShare,
    JobShare,
)

__all__ = ["CALLS_PREFIX", "ORPHAN_GRANT_S", "PUMP_S", "CallPlaces", "Dispatch", "FairShare",
           "JobShare", "pump_once", "start_pump", "tenant_budget_scopes"]
