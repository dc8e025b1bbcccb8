"""The durable results store: finished records and jobs in PostgreSQL (``DROVER_RESULTS_URL``).

Redis keeps a job while it runs and for ``DROVER_RESULT_TTL_S`` after; this store keeps what
a team asks for later (last week's job, its usage, a failed sub-agent's error). It is written
beside Redis, never instead of it: Redis's fenced write (lua/record.lua) decides whether a
record is the one that counts, and only a record it stored comes here. The primary key
(job_id, idx) with ``ON CONFLICT DO NOTHING`` makes a second write of one record (a retry after
a crash between the two writes, the join's catch-up) a no-op, so each record is here once.

Plain SQL through psycopg 3 (the ``postgres`` extra): one connection per process, shared by
the worker's threads under a lock (each statement is short; autocommit). The schema is made
on first use under an advisory lock (many workers start at once) and versioned in
``drover_schema_version``; ``SCHEMA_SQL`` is what ``drover results-schema`` prints.

Nothing here logs or raises the URL's password: errors name the URL masked.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import urlsplit

from drover.config.settings import mask_url
from drover.errors import ResultsStoreError
from drover.workers.jobs.records import STATUSES, JobResult, SubagentResult

__all__ = ["SCHEMA_SQL", "SCHEMA_VERSION", "ResultsStore"]

SCHEMA_VERSION = 1
# Any number fixed for drover: the advisory lock that makes concurrent first uses wait.
_LOCK_ID = 7_402_040
SCHEMA_SQL = f"""\
-- drover results store, schema version {SCHEMA_VERSION} (docs/results-store.md).
-- Safe to run again: every statement is IF NOT EXISTS / ON CONFLICT DO NOTHING.
CREATE TABLE IF NOT EXISTS drover_schema_version (
    version    integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS drover_jobs (
    job_id      text PRIMARY KEY,
    status      text NOT NULL,
    n           integer NOT NULL,
    spec        jsonb,
    subtasks    jsonb,
    usage       jsonb NOT NULL,
    result      jsonb NOT NULL,      -- the JobResult without its records (drover_records)
    created_at  double precision,
    finished_at double precision NOT NULL
);
CREATE INDEX IF NOT EXISTS drover_jobs_finished ON drover_jobs (finished_at DESC);
CREATE TABLE IF NOT EXISTS drover_records (
    job_id  text NOT NULL,
    idx     integer NOT NULL,        -- the sub-agent's index in its job
    status  text NOT NULL,
    record  jsonb NOT NULL,          -- the SubagentResult
    final   bytea,                   -- its final state, as Redis keeps it (JobStore.pack_final)
    PRIMARY KEY (job_id, idx)
);
INSERT INTO drover_schema_version (version) VALUES ({SCHEMA_VERSION}) ON CONFLICT DO NOTHING;
"""



class ResultsStore:
    """Records and finished jobs in PostgreSQL; see the module docstring."""

    def __init__(self, url: str, *, connect_timeout_s: int = 3):
        self._url = url
        self.where = mask_url(url)
        self._timeout = connect_timeout_s
        self._conn: Any = None
        self._lock = threading.Lock()
        self._schema_ok = False

    def __repr__(self) -> str:
        return f"ResultsStore({self.where!r})"

    # --- plumbing -------------------------------------------------------------------------
    def _error(self, error: BaseException) -> ResultsStoreError:
        # psycopg's own text names host and port, never the password; mask it anyway in case
        # a driver version echoes the conninfo.
        text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        password = urlsplit(self._url).password
        if password:
            text = text.replace(password, "***")
        return ResultsStoreError(f"results store {self.where}: {text}")

    def _run(self, work: Any) -> Any:
        """``work(cursor)`` on the process's connection (made, and the schema with it, on
        first use; made again once after a dropped connection)."""
        try:
            import psycopg
        except ImportError:
            raise ResultsStoreError(f"results store {self.where}: psycopg is not installed "
                                    "(pip install 'drover[postgres]')") from None

        with self._lock:
            for attempt in (0, 1):
                fresh = self._conn is None or self._conn.closed
                try:
                    if fresh:
                        self._conn = psycopg.connect(self._url, autocommit=True,
                                                     connect_timeout=self._timeout)
                        # A record's copy need not wait for the disk: Redis holds it until
                        # its job's end, which copies whatever PostgreSQL lost (a crash of
                        # the server loses at most its last moments of commits). The job's
                        # row, written last, commits synchronously (put_job). See
                        # docs/results-store.md for what a record's write costs.
                        self._conn.execute("SET synchronous_commit = off")
                    if not self._schema_ok:
                        self._create_schema()
                    with self._conn.cursor() as cur:
                        return work(cur)
                except psycopg.OperationalError as error:
                    self._drop()
                    # Once more only when a connection that had worked dropped (a restart):
                    # a server that refuses a new one is not asked twice.
                    if attempt or fresh:
                        raise self._error(error) from None
                except psycopg.Error as error:
                    raise self._error(error) from None
        raise AssertionError("unreachable")

    def _drop(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # a dead socket: closing it is best effort
                pass
        self._conn = None

    def _create_schema(self) -> None:
        with self._conn.transaction(), self._conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_ID,))
            cur.execute(SCHEMA_SQL)
        self._schema_ok = True

    def close(self) -> None:
        with self._lock:
            self._drop()

    def check(self) -> None:
        """Connect and make the schema now (ResultsStoreError if it does not answer)."""
        self._run(lambda cur: cur.execute("SELECT 1"))

    def schema_version(self) -> int:
        return int(self._run(lambda cur: cur.execute(
            "SELECT max(version) FROM drover_schema_version").fetchone()[0]))

    # --- writes ---------------------------------------------------------------------------
    def put_records(self, rows: Iterable[tuple[SubagentResult, bytes | None]]) -> int:
        """Write records (with their final state, or None); one that is here already stays
        as it is. Returns how many were new."""
        params = [(r.job_id, r.index, r.status, r.model_dump_json(exclude_defaults=True), final)
                  for r, final in rows]
        if not params:
            return 0

        def work(cur: Any) -> int:
            cur.executemany("INSERT INTO drover_records (job_id, idx, status, record, final) "
                            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING", params)
            return max(0, cur.rowcount)

        return int(self._run(work))

    def put_job(self, result: JobResult, *, spec: str | None, subtasks: list[str] | None,
                created: float | None, finished: float, n: int) -> None:
        """Write the finished job (its spec, usage and result without its records)."""
        stored = result.model_copy(update={"results": [], "by_reference": True})
        params = (result.job_id, result.status, n, spec,
                  json.dumps(subtasks) if subtasks is not None else None,
                  result.usage.model_dump_json(), stored.model_dump_json(), created, finished)
        def work(cur: Any) -> None:
            with cur.connection.transaction():
                cur.execute("SET LOCAL synchronous_commit = on")  # the job's end: durable
                cur.execute(
                    "INSERT INTO drover_jobs (job_id, status, n, spec, subtasks, usage, "
                    "result, created_at, finished_at) VALUES (%s, %s, %s, %s, %s, %s, %s, "
                    "%s, %s) ON CONFLICT DO NOTHING", params)

        self._run(work)

    # --- reads ----------------------------------------------------------------------------
    def record_count(self, job_id: str) -> int:
        return int(self._run(lambda cur: cur.execute(
            "SELECT count(*) FROM drover_records WHERE job_id = %s", (job_id,)).fetchone()[0]))

    def job(self, job_id: str) -> dict[str, Any] | None:
        """The job's row (status, n, spec, subtasks, usage, result, created_at, finished_at)."""
        def work(cur: Any) -> dict[str, Any] | None:
            cur.execute("SELECT status, n, spec, subtasks, usage, result, created_at, "
                        "finished_at FROM drover_jobs WHERE job_id = %s", (job_id,))
            row = cur.fetchone()
            if row is None:
                return None
            names = ("status", "n", "spec", "subtasks", "usage", "result", "created_at",
                     "finished_at")
            return dict(zip(names, row, strict=True))

        return self._run(work)

    def result(self, job_id: str) -> JobResult | None:
        """The job's JobResult without its records (``records`` reads them)."""
        row = self.job(job_id)
        if row is None:
            return None
        result = JobResult.model_validate(row["result"])
        result.by_reference = False
        return result

    def records_page(self, job_id: str, start: int, stop: int) -> list[SubagentResult | None]:
        """Records ``start`` to ``stop - 1`` (None where there is none)."""
        rows = self._run(lambda cur: cur.execute(
            "SELECT idx, record FROM drover_records WHERE job_id = %s AND idx >= %s "
            "AND idx < %s ORDER BY idx", (job_id, start, stop)).fetchall())
        found = {idx: SubagentResult.model_validate(raw) for idx, raw in rows}
        return [found.get(i) for i in range(start, stop)]

    def iter_records(self, job_id: str, page: int = 500) -> Iterator[SubagentResult]:
        """The job's records in index order, ``page`` at a time (keyset paging)."""
        after = -1
        while True:
            rows = self._run(lambda cur, a=after: cur.execute(
                "SELECT idx, record FROM drover_records WHERE job_id = %s AND idx > %s "
                "ORDER BY idx LIMIT %s", (job_id, a, page)).fetchall())
            for idx, raw in rows:
                after = idx
                yield SubagentResult.model_validate(raw)
            if len(rows) < page:
                return

    def final(self, job_id: str, index: int) -> bytes | None:
        row = self._run(lambda cur: cur.execute(
            "SELECT final FROM drover_records WHERE job_id = %s AND idx = %s",
            (job_id, index)).fetchone())
        return bytes(row[0]) if row and row[0] is not None else None

    def status_counts(self, job_id: str) -> dict[str, int]:
        rows = self._run(lambda cur: cur.execute(
            "SELECT status, count(*) FROM drover_records WHERE job_id = %s GROUP BY status",
            (job_id,)).fetchall())
        counts: dict[str, int] = dict.fromkeys(STATUSES, 0)
        counts.update({status: int(n) for status, n in rows})
        return counts

    def jobs(self, limit: int = 20) -> list[dict[str, Any]]:
        """The latest finished jobs, newest first: job_id, status, n, finished_at, counts."""
        rows = self._run(lambda cur: cur.execute(
            "SELECT job_id, status, n, finished_at, result->'counts' FROM drover_jobs "
            "ORDER BY finished_at DESC LIMIT %s", (limit,)).fetchall())
        return [{"job_id": j, "status": s, "n": n, "finished_at": f, "counts": c or {}}
                for j, s, n, f, c in rows]
