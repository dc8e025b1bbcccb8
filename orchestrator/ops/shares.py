"""Who has which share of the fleet now: the active jobs and tenants of the fair-share window.

Read from the scheduler's state (``drover.workers.fairshare``) and the job store, so it sees
every worker on every host. A job's *share* is its part of the window (sub-agents in the
broker or running) out of what is out now: since running sub-agents queue for the limiter on
equal terms, that is also its share of the key's capacity. *Due* is what the fair-share rule
gives it when every job that waits keeps waiting; *waiting* is its backlog, not yet published.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table

from drover.config import Settings
from drover.config.settings import TenantBudget
from drover.workers.fairshare import FairShare, JobShare, tenant_budget_scopes
from drover.workers.jobs.spec import PRIORITIES
from drover.workers.limiter import Limiter
from drover.workers.recovery import stalled_jobs

__all__ = ["ActiveJob", "active_jobs", "budget_text", "due_shares", "jobs_table",
           "tenants_table"]


@dataclass(frozen=True)
class ActiveJob:
    share: JobShare
    held: float  # part of what is out now
    due: float   # part of the window the rule gives it under contention
    position: int  # 1 = next to get a free place
    last_out_s: float | None = None  # expected seconds to its last dispatch (None: unknown)
    stalled: bool = False  # the sweep found it stalled (workers/recovery/sweep.py, step 4)


def due_shares(jobs: list[JobShare], floor: float) -> dict[str, float]:
    """The window's split when every job with a backlog keeps one: tenant by weight, then
    priority level (the highest waiting level all but ``floor`` per lower level), then jobs
    equally. Jobs without a backlog keep what they hold."""
    waiting = [j for j in jobs if j.waiting]
    due: dict[str, float] = {}
    tenants: dict[str, list[JobShare]] = {}
    for j in waiting:
        tenants.setdefault(j.tenant, []).append(j)
    total_w = sum(max(j.weight for j in group) for group in tenants.values())
    for group in tenants.values():
        tenant_part = max(j.weight for j in group) / total_w
        ranks = sorted({PRIORITIES.index(j.priority) for j in group})
        for i, rank in enumerate(ranks):
            level = [j for j in group if PRIORITIES.index(j.priority) == rank]
            level_part = (1 - floor * (len(ranks) - 1)) if i == 0 else floor
            for j in level:
                due[j.job_id] = tenant_part * level_part / len(level)
    return due


def active_jobs(settings: Settings, fs: FairShare) -> list[ActiveJob]:
    """The jobs of ``fs``'s queue (the caller's root's scheduler), each with its share."""
    jobs = fs.jobs()
    out = sum(j.out for j in jobs) or 1
    due = due_shares(jobs, settings.priority_floor)
    # Next free place: the waiting job furthest below what it is due.
    order = sorted((j for j in jobs if j.waiting),
                   key=lambda j: (j.out / out - due.get(j.job_id, 0.0), j.arrival))
    position = {j.job_id: i + 1 for i, j in enumerate(order)}
    stalled = stalled_jobs(fs.r, settings.key_prefix)
    now = fs.server_time()
    return [ActiveJob(j, j.out / out, due.get(j.job_id, 0.0), position.get(j.job_id, 0),
                      j.last_dispatch_in_s(now), j.job_id in stalled)
            for j in jobs]


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def jobs_table(active: list[ActiveJob], window: int, cap: int | None = None) -> Table:
    """``waiting``: sub-agents in line (not yet published); ``last out``: expected time to
    the job's last dispatch at the rate its records come in; ``state``: stalled when the
    sweep found sub-agents out, no record for a while and no live worker holding them."""
    line = f", the limiter's line {cap}" if cap else ""
    table = Table(title=f"active jobs (window {window} sub-agents{line})")
    table.add_column("job", no_wrap=True, min_width=12)
    for column in ("tenant", "priority", "progress", "out", "retrying", "waiting", "last out",
                   "share", "due", "next", "state"):
        table.add_column(column, justify="left" if column in ("tenant", "priority", "state")
                         else "right")
    for a in active:
        s = a.share
        # A gateway process's calls of a tenant (calls:<process>:<tenant>): no job of its own.
        table.add_row("gateway" if s.calls else s.job_id[:12], s.tenant, s.priority,
                      f"{s.done}/{s.n}", str(s.out),
                      str(s.deferred), str(s.waiting),
                      _duration(a.last_out_s) if s.waiting else "-", f"{a.held:.0%}",
                      f"{a.due:.0%}" if s.waiting else "-",
                      str(a.position) if a.position else "-",
                      "[red]stalled[/red]" if a.stalled else "ok")
    return table


def budget_text(limiter: Limiter | None, tenant: str, budget: TenantBudget | None) -> str:
    """A tenant's budget and its use: tokens of the last minute, what its day bucket holds."""
    if budget is None:
        return "-"
    parts = []
    for scope, _, burst_s in tenant_budget_scopes(tenant, budget.per_minute, budget.per_day):
        if burst_s <= 60:
            used = 0 if limiter is None else sum(
                row.get("input_tokens", 0) for row in limiter.usage(scope, 60))
            parts.append(f"{used:,}/{budget.per_minute:,.0f} a minute")
        else:
            bucket = (limiter.state(scope).get("input_tokens") if limiter else None) or {}
            level = bucket.get("level")
            left = float(level if level is not None else budget.per_day or 0.0)
            parts.append(f"{max(0.0, left):,.0f} of {budget.per_day:,.0f} a day left")
    return ", ".join(parts)


def tenants_table(active: list[ActiveJob], settings: Settings,
                  limiter: Limiter | None = None) -> Table:
    table = Table(title="tenants")
    for column in ("tenant", "weight", "jobs", "out", "waiting", "share", "due", "budget"):
        table.add_column(column, justify="left" if column in ("tenant", "budget") else "right")
    tenants: dict[str, list[ActiveJob]] = {}
    for a in active:
        tenants.setdefault(a.share.tenant, []).append(a)
    for tenant, group in sorted(tenants.items()):
        text = budget_text(limiter, tenant, settings.tenant_budgets.get(tenant))
        table.add_row(tenant, f"{settings.tenant_weight(tenant):g}", str(len(group)),
                      str(sum(a.share.out for a in group)),
                      str(sum(a.share.waiting for a in group)),
                      f"{sum(a.held for a in group):.0%}",
                      f"{sum(a.due for a in group if a.share.waiting):.0%}", text)
    return table
