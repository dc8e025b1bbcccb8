"""A job's state in Redis, by what it holds: the spec and subtasks (``Specs``), the meta hash
and the job index (``JobMeta``), the records (``Records``), the outcome (``Outcomes``), the
event stream (``Stream``), a running sub-agent's state (``Checkpoints``), the cancel
(``Cancels``), what it spent (``Spending``), its counters (``Counters``) and the claims
(``Claims``); the results store behind them is the ``Archive``.

Task messages carry ids only; everything a sub-agent needs (its prompt, its conversation so
far) is read from here, so prompts never travel through the broker or show up in Flower.
Every key of a job starts with ``{prefix}:job:{id}:`` and expires with the job's records.

The parts are synchronous: the orchestrator and the CLI call them directly, and the worker's
event loop calls them through ``asyncio.to_thread`` (a Redis round trip is short, and keeping
one implementation beats keeping a sync and an async copy in step).
"""

from __future__ import annotations

import redis

from drover.errors import JobNotFound
from drover.workers.jobs.archive import Archive
from drover.workers.jobs.cancels import Cancels
from drover.workers.jobs.checkpoints import Checkpoints, SubagentStart
from drover.workers.jobs.claims import Claims
from drover.workers.jobs.counters import Counters
from drover.workers.jobs.keys import JobKeys
from drover.workers.jobs.meta import ACTIVE, JobMeta
from drover.workers.jobs.outcomes import Outcomes
from drover.workers.jobs.record_store import PAGE, Records
from drover.workers.jobs.results_db import ResultsStore
from drover.workers.jobs.specs import Specs
from drover.workers.jobs.spending import Spending
from drover.workers.jobs.stream import Stream

__all__ = ["ACTIVE", "PAGE", "JobNotFound", "JobStore", "SubagentStart"]


class JobStore:
    """The parts of one Redis client and key prefix, built together (they share the client,
    the key names and the TTL, and some read through others). Only groups them: a caller
    uses the part it needs (``store.records.put(...)``)."""

    def __init__(self, client: redis.Redis, *, prefix: str = "drover", ttl_s: int = 604800,
                 results: ResultsStore | None = None):
        self.r = client
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.keys = JobKeys(prefix)
        # The durable results store (DROVER_RESULTS_URL), or None: records and finished jobs
        # are copied there, and a job Redis no longer has is read from there.
        self.archive = Archive(client, self.keys, results, ttl_s)
        self.claims = Claims(client, prefix, ttl_s)
        self.specs = Specs(client, self.keys, ttl_s, self.archive)
        self.meta = JobMeta(client, self.keys, self.archive)
        self.records = Records(client, self.keys, ttl_s, self.archive)
        self.outcomes = Outcomes(client, self.keys, ttl_s, archive=self.archive,
                                 records=self.records, specs=self.specs, meta=self.meta)
        self.stream = Stream(client, self.keys)
        self.cancels = Cancels(client, self.keys, ttl_s, meta=self.meta, archive=self.archive)
        self.checkpoints = Checkpoints(client, self.keys, ttl_s, claims=self.claims,
                                       cancels=self.cancels)
        self.spending = Spending(client, self.keys, ttl_s)
        self.counters = Counters(client, self.keys, ttl_s)
