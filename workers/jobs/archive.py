"""The durable results store (``DROVER_RESULTS_URL``, ``results_db.py``) as the job store's
parts see it: where records are copied as they are stored, and where a job Redis no longer
has is read from."""

from __future__ import annotations

import logging
import time
from typing import Any

import redis

from drover.errors import JobNotFound, ResultsStoreError
from drover.workers.jobs._stored import unpack_final
from drover.workers.jobs.keys import JobKeys
from drover.workers.jobs.records import Checkpoint, SubagentResult
from drover.workers.jobs.results_db import ResultsStore

__all__ = ["Archive"]

# The logger the job store warned on before it was split (logging configurations name it).
log = logging.getLogger("drover.workers.jobs.store")

RESULTS_RETRY_S = 30.0  # how long records skip a results store that did not answer

_warned = [0.0]


def warn(message: str, *, each_time: bool = False) -> None:
    """One warning line (no traceback), at most once a minute per process (``each_time``: a
    job's end, said for each job)."""
    now = time.monotonic()
    if each_time or now - _warned[0] >= 60 or not _warned[0]:
        _warned[0] = now
        log.warning("drover: %s", message)


class Archive:
    """The results store behind Redis, or none (``store`` is None: every method is a no-op
    or says the job is not gone)."""

    def __init__(self, client: redis.Redis, keys: JobKeys, store: ResultsStore | None) -> None:
        self.r = client
        self.keys = keys
        self.store = store
        self._down_until = 0.0  # records skip the store until then (``keep``)

    def gone(self, job_id: str) -> bool:
        """True when a results store is set and Redis no longer has the job (read it there)."""
        return self.store is not None and not self.r.exists(self.keys.job(job_id, "meta"))

    def job(self, job_id: str) -> dict[str, Any] | None:
        """The job's row in the results store (``JobNotFound`` when the store did not answer)."""
        try:
            return self.store.job(job_id)  # type: ignore[union-attr]
        except ResultsStoreError as error:
            raise JobNotFound(f"no job {job_id!r} in Redis, and {error}") from None

    def keep(self, rows: list[tuple[SubagentResult, bytes | None]]) -> None:
        """Copy records Redis has just stored into the results store. Should it not answer,
        the records stay in Redis (nothing is lost) and the job's end copies them
        (``JobResults.save``); one warning line says so, at most once a minute."""
        if self.store is None or not rows or time.monotonic() < self._down_until:
            return
        try:
            self.store.put_records(rows)
        except ResultsStoreError as error:
            # Not asked again for a while: each try may wait out a connect timeout, and a
            # sub-agent's record must not wait on a store that is away.
            self._down_until = time.monotonic() + RESULTS_RETRY_S
            warn(f"{error}; the records stay in Redis and are copied when the job ends")

    def final_state(self, job_id: str, index: int) -> Checkpoint | None:
        """A finished sub-agent's final state from the results store, once Redis has no job."""
        if not self.gone(job_id):
            return None
        packed = self.store.final(job_id, index)  # type: ignore[union-attr]
        return unpack_final(packed) if packed else None
