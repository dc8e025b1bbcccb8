"""Caps in dollars, checked before each call as the token limits are: ``JobSpec.max_cost_usd``
(one job) and a tenant's ``usd_per_month`` (``DROVER_TENANT_BUDGETS``, every job of the
tenant in a calendar month, UTC).

Before a call is sent, its worst case is reserved under each cap that applies: its input
estimate (with the limiter's margin) at the dearer of the input and cache-write prices, and
``max_tokens`` of output. A call whose worst case would pass a cap is not sent
(``CostCapReached``: its sub-agent ends ``budget_exceeded``); the job's cap then stays reached,
so every later call of the job is refused too and the job stops at one point. After the call,
the reservation is replaced by what the call cost (an answer at its usage, a call sent and
never answered at what it is counted, nothing for a call refused or never sent). So what a
job spends stays within its cap, but for the input estimate's error: within one call's worth.

Message Batch jobs (``delivery="batch"``) are capped the same way: before a sub-agent's turn
is put into a batch, its worst case at the Batches discount is reserved (``batch=True``) and
kept in its checkpoint while the batch runs; when the result comes back the reservation
becomes what it cost (a ``succeeded`` result at its usage and the discount; ``errored``,
``expired`` or ``canceled``: nothing).

Prices are DROVER_PRICES over the bundled table (``config/prices.py``); a job capped in dollars
on a model without a price is refused at submit, and a tenant's monthly cap cannot be checked
for such a model's calls (they are logged once and go out).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from drover.config.prices import Price
from drover.errors import CostCapReached
from drover.workers.agent.runtime import Runtime
from drover.workers.providers import AnswerUsage

__all__ = ["CostHold", "month", "reserve_cost", "settle_cost"]

log = logging.getLogger(__name__)
TENANT_MONTH_TTL_S = 40 * 86_400  # a month's tally outlives its month a little
_unpriced_logged: set[str] = set()


@dataclass
class CostHold:
    """A call's reservations under its caps: (key, dollars reserved) each, and its price."""

    holds: list[tuple[str, float]]
    price: Price
    batch: bool = False  # a Message Batch request: priced at the Batches discount


def month(now: datetime | None = None) -> str:
    """The calendar month (UTC) a tenant's cap counts in, ``YYYY-MM``."""
    return (now or datetime.now(UTC)).strftime("%Y-%m")


def _worst(price: Price, input_tokens: int, max_tokens: int) -> float:
    return price.cost(0, max_tokens) + input_tokens * max(price.input, price.cache_write) / 1e6


async def reserve_cost(rt: Runtime, job_id: str, tenant: str | None, cap_usd: float | None,
                       model: str, input_tokens: int, max_tokens: int, *,
                       batch: bool = False) -> CostHold | None:
    """Reserve the call's worst case under the job's cap and the tenant's monthly cap (None:
    neither applies); CostCapReached, with nothing reserved, when one would be passed.
    ``batch``: a Message Batch request, whose worst case is at the Batches discount."""
    budget = rt.settings.tenant_budgets.get(tenant or "")
    tenant_cap = budget.usd_per_month if budget is not None else None
    if cap_usd is None and tenant_cap is None:
        return None
    price = rt.settings.price_of(model)
    if price is None:  # a capped job on it is refused at submit: this is a tenant's cap
        if model not in _unpriced_logged:
            _unpriced_logged.add(model)
            log.warning("tenant %s has a monthly cap in dollars, but %s has no price "
                        "(DROVER_PRICES): its calls are not counted against the cap", tenant,
                        model)
        return None
    worst = _worst(price, input_tokens, max_tokens) * (price.batch if batch else 1.0)
    spending = rt.store.spending
    holds: list[tuple[str, float]] = []
    if cap_usd is not None:
        key = rt.store.keys.job(job_id, "usd")
        why = (f"the job's cost cap of ${cap_usd:,.4f} (JobSpec.max_cost_usd) is reached: "
               "its next call could pass it")
        ok, total, reason = await asyncio.to_thread(
            spending.reserve_usd, key, cap_usd, worst, rt.settings.result_ttl_s, why)
        if not ok:
            raise CostCapReached(f"{reason or why} (${total:,.4f} spent or reserved, the next "
                                 f"call up to ${worst:,.4f}); nothing more is sent")
        holds.append((key, worst))
    if tenant_cap is not None:
        key = rt.store.keys.tenant_usd(tenant or "default", month())
        ok, total, _ = await asyncio.to_thread(spending.reserve_usd, key, tenant_cap, worst,
                                               TENANT_MONTH_TTL_S)
        if not ok:
            await settle_cost(rt, CostHold(holds, price, batch))  # give the job's reservation back
            raise CostCapReached(
                f"the monthly cost cap of tenant {tenant} (${tenant_cap:,.2f}, "
                f"DROVER_TENANT_BUDGETS usd_per_month) is reached: ${total:,.4f} spent or "
                f"reserved this month, the next call up to ${worst:,.4f}; raise the cap or "
                "wait for the month to turn")
        holds.append((key, worst))
    return CostHold(holds, price, batch)


async def settle_cost(rt: Runtime, hold: CostHold | None, usage: AnswerUsage | None = None,
                      lost: tuple[int, int] | None = None) -> None:
    """Replace the reservations by what the call cost: an answer's ``usage``, a call sent
    and never answered at its (input, output) count, or nothing (refused, never sent)."""
    if hold is None or not hold.holds:
        return
    paid = 0.0
    if usage is not None:
        paid = hold.price.cost(
            int(usage.input_tokens or 0), int(usage.output_tokens or 0),
            int(getattr(usage, "cache_creation_input_tokens", 0) or 0),
            int(getattr(usage, "cache_read_input_tokens", 0) or 0), batch=hold.batch)
    elif lost is not None:
        paid = hold.price.cost(*lost)
    await asyncio.shield(asyncio.to_thread(rt.store.spending.settle_usd, hold.holds, paid))
