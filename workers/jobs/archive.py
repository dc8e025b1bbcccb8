"""The durable results store (``DROVER_RESULTS_URL``, ``results_db.py``) as the job store's
parts see it: where records are copied as they are stored, and where a job Redis no longer
has is read from."""

from __future__ import annotations

import logging
import queue
import threading
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
QUEUED_MAX = 10_000  # batches of records waiting for the writer; past it, the catch-up copies
BATCH_ROWS = 200  # queued batches written in one go

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
    or says the job is not gone).

    Records reach the store from a writer thread of the process (``keep`` only queues them),
    in batches: a sub-agent never waits on PostgreSQL, however slow or silent it is. A batch
    the store refuses, or one queued while it is known away, leaves its jobs on the list of
    jobs the store is behind on (``{prefix}:results:pending``, by when it first fell behind);
    the records stay in Redis, and the job's end or the recovery sweep copies them once the
    store answers (``Outcomes``)."""

    def __init__(self, client: redis.Redis, keys: JobKeys, store: ResultsStore | None,
                 ttl_s: int = 7 * 86400) -> None:
        self.r = client
        self.keys = keys
        self.store = store
        self.ttl_s = ttl_s  # the pending list's: its jobs live no longer in Redis
        self._down_until = 0.0  # records skip the store until then (``keep``)
        self._queue: queue.Queue[list[tuple[SubagentResult, bytes | None]]] = queue.Queue(
            maxsize=QUEUED_MAX)
        self._writer: threading.Thread | None = None
        self._writer_lock = threading.Lock()

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
        """Copy records Redis has just stored into the results store, from the writer thread
        (returns at once). Should it not answer, the records stay in Redis (nothing is lost),
        their jobs are listed as behind, and one warning line says so, at most once a
        minute."""
        if self.store is None or not rows:
            return
        if time.monotonic() < self._down_until:
            self.behind({r.job_id for r, _ in rows})
            return
        self._start_writer()
        try:
            self._queue.put_nowait(rows)
        except queue.Full:  # the store is far behind: the catch-up copies these
            self.behind({r.job_id for r, _ in rows})

    def behind(self, job_ids: set[str]) -> None:
        """List jobs whose records (or end) the store missed, each by when it first did."""
        if not job_ids:
            return
        try:
            pipe = self.r.pipeline()
            self.list_behind(pipe, job_ids)
            pipe.execute()
        except redis.RedisError:  # Redis away too: the job's end lists it if need be
            pass

    def list_behind(self, pipe: Any, job_ids: set[str]) -> None:
        """``behind``'s writes, added to ``pipe`` (a job listed already keeps its time)."""
        pipe.zadd(self.keys.results_pending, dict.fromkeys(job_ids, time.time()), nx=True)
        pipe.expire(self.keys.results_pending, self.ttl_s)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until the writer has written (or given up on) what was queued."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def _start_writer(self) -> None:
        if self._writer is not None and self._writer.is_alive():
            return
        with self._writer_lock:
            if self._writer is None or not self._writer.is_alive():  # (again after a fork)
                self._queue = queue.Queue(maxsize=QUEUED_MAX)
                self._writer = threading.Thread(target=self._write, daemon=True,
                                                name="drover-results-writer")
                self._writer.start()

    def _write(self) -> None:
        mine = self._queue
        while True:
            batches = [mine.get()]
            while len(batches) < BATCH_ROWS:
                try:
                    batches.append(mine.get_nowait())
                except queue.Empty:
                    break
            rows = [row for batch in batches for row in batch]
            try:
                # Known away (a batch before this one failed): not tried, listed at once.
                if time.monotonic() < self._down_until or self.store is None:
                    self.behind({r.job_id for r, _ in rows})
                else:
                    self.store.put_records(rows)
            except ResultsStoreError as error:
                # Not asked again for a while: each try may wait out a timeout. The records
                # are in Redis; the job's end or the sweep copies them.
                self._down_until = time.monotonic() + RESULTS_RETRY_S
                warn(f"{error}; the records stay in Redis and are copied once it answers")
                self.behind({r.job_id for r, _ in rows})
            except Exception:  # never let the thread die: the catch-up still copies them
                log.exception("drover: the results store's writer failed")
                self.behind({r.job_id for r, _ in rows})
            finally:
                for _ in batches:
                    mine.task_done()

    def final_state(self, job_id: str, index: int) -> Checkpoint | None:
        """A finished sub-agent's final state from the results store, once Redis has no job."""
        if not self.gone(job_id):
            return None
        packed = self.store.final(job_id, index)  # type: ignore[union-attr]
        return unpack_final(packed) if packed else None
