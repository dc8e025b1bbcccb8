"""A tenant's token budget as limiter scopes of its own, acquired beside the model's."""

from __future__ import annotations

__all__ = ["tenant_budget_scopes"]


def tenant_budget_scopes(tenant: str, per_minute: float | None, per_day: float | None
                         ) -> list[tuple[str, float, float]]:
    """The limiter scopes of a tenant's token budget: (scope, tokens/min, burst seconds).

    A per-minute budget is a bucket holding one minute of it; a per-day budget a bucket
    holding one day of it, refilled continuously (so a tenant that spent its day waits for
    the refill, not for midnight). Both count input + output tokens.
    """
    scopes = []
    if per_minute:
        scopes.append((f"tenant:{tenant}:minute", float(per_minute), 60.0))
    if per_day:
        scopes.append((f"tenant:{tenant}:day", float(per_day) / 1440.0, 86400.0))
    return scopes
