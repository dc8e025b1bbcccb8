"""A request of a size its scope has not calibrated is reserved at the provider's own count
(Anthropic's count_tokens, once per size), not at the factor of shorter prompts: their
markup counts more tokens a character than a long prompt's prose, and one factor learnt on
them reserved bench.small_keys --mix's long prompts at 1.24 x their count (issue 53, item 3)."""

from __future__ import annotations

import logging
import re

from drover import JobSpec, submit

SHORT = "Summarise account {i} in a few lines [[sim:out=20]]"
LONG = SHORT + ": " + " ".join(["ledger entry"] * 225)


def _calls(records: list[logging.LogRecord]) -> dict[int, dict[str, str]]:
    """Each sub-agent's answered call, as its log line says it (est_in, in, ...)."""
    lines = (r.getMessage() for r in records)
    return {int(f["sub"]): f for f in (dict(re.findall(r"(\w+)=(\S+)", line))
                                        for line in lines if "llm call outcome=ok" in line)}


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_long_prompt_after_short_ones_is_reserved_at_its_count(worker, sim):
    # The call log's own handler: the in-process worker sets up Celery's logging.
    logger, kept = logging.getLogger("drover.workers.agent.llm"), _Kept()
    level = logger.level
    logger.addHandler(kept)
    logger.setLevel(logging.INFO)
    try:
        worker(concurrency=1)
        result = submit(JobSpec(subtasks=[SHORT.format(i=i) for i in range(3)] + [
            LONG.format(i=3)], max_tokens=100)).wait(timeout=120)
    finally:
        logger.removeHandler(kept)
        logger.setLevel(level)
    assert result.counts["ok"] == 4
    calls = _calls(kept.records)
    short, long = calls[0], calls[3]
    assert int(short["in"]) < 100 < int(long["in"])
    # Estimated at the count, where the short prompts' factor gave 1.2 x it.
    assert int(long["est_in"]) == int(long["in"]), long
    assert sim.stats()["accepted"] == 4  # the count is no call of the limits
