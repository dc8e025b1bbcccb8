"""The calendar the money follows: a spend limit lifts when the month turns (00:00 UTC on the
first), and a tenant's monthly cap counts in the calendar month (UTC)."""

from __future__ import annotations

from datetime import UTC, datetime

from drover.workers.agent.caps import month
from drover.workers.agent.spend_limit import until_month_turns


def test_a_spend_limit_lifts_at_the_first_of_next_month_utc():
    assert until_month_turns(datetime(2026, 12, 31, 23, 0, tzinfo=UTC)) == 3600
    assert until_month_turns(datetime(2026, 2, 28, 0, 0, tzinfo=UTC)) == 86_400
    assert until_month_turns(datetime(2026, 3, 1, 0, 0, tzinfo=UTC)) == 31 * 86_400


def test_a_tenants_month_is_the_calendar_month_in_utc():
    assert month(datetime(2026, 12, 31, 23, 59, tzinfo=UTC)) == "2026-12"
    assert month(datetime(2027, 1, 1, 0, 0, tzinfo=UTC)) == "2027-01"
