"""The durable results store: finished records and jobs in PostgreSQL (``DROVER_RESULTS_URL``).

Redis keeps a job while it runs and for ``DROVER_RESULT_TTL_S`` after; this store keeps what
a team asks for later (last week's job, its usage, a failed sub-agent's error). It is written
beside Redis, never instead of it: Redis's fenced write (lua/record.lua) decides whether a
record is the one that counts, and only a record it stored comes here. The primary key
(job_id, idx) with ``ON CONFLICT DO NOTHING`` makes a second write of one record (a retry after
a crash between the two writes, the join's catch-up) a no-op, so each record is here once.

Plain SQL through psycopg 3 (the ``postgres`` extra), autocommit, on a small pool per
process (``_Pool``: at most ``pool_size`` connections, made on demand, idle ones reused, a
broken one dropped). The schema is made on first use under an advisory lock (many workers
start at once) and versioned in ``drover_schema_version``; ``SCHEMA_SQL`` is what ``drover
results-schema`` prints.

A database that goes silent (a failover, a NAT that forgot the connection: no FIN, no RST)
must never hold a caller: every statement has the server's ``statement_timeout``
(``timeout_s``) and a deadline 2 s beyond it, past which ``_Deadlines`` shuts the socket
down, so the statement fails at once and its connection is dropped; TCP keepalives and
``tcp_user_timeout`` find a dead peer of an idle or sending connection on their own, and
``connect_timeout`` bounds a connect. Why not psycopg_pool: it connects in its own threads
and retries for ``reconnect_timeout``, and a caller waiting for a connection learns only
"couldn't get a connection after N s", not the reason (refused, authentication, DNS) that
its warning must give; it also starts four threads in every process (every prefork child,
every ``drover result``). What the store needs of a pool is the few lines of ``_Pool``.

Nothing here logs or raises the URL's password: errors name the URL masked.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
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



GRACE_S = 2.0  # beyond the server's statement timeout, before a silent connection is cut


class _Cut:
    """One statement's watch: ``cut`` once its deadline passed and its socket was shut."""

    __slots__ = ("conn", "cut", "due")

    def __init__(self, conn: Any, due: float) -> None:
        self.conn, self.due, self.cut = conn, due, False


class _Deadlines:
    """Shuts down the socket of a connection whose statement is past its deadline.

    libpq waits for an answer as long as the socket is open, and a silent peer never closes
    it; the server's statement_timeout cannot help when the server never hears the
    statement. A shutdown from this thread wakes the waiting one with an end of stream
    (psycopg raises OperationalError and marks the connection broken). One thread per
    process, asleep while no statement runs."""

    def __init__(self) -> None:
        self._watches: set[_Cut] = set()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    @contextmanager
    def watch(self, conn: Any, seconds: float) -> Iterator[_Cut]:
        watch = _Cut(conn, time.monotonic() + seconds)
        with self._cond:
            self._watches.add(watch)
            if self._thread is None or not self._thread.is_alive():  # (again after a fork)
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="drover-results-deadlines")
                self._thread.start()
            self._cond.notify()
        try:
            yield watch
        finally:
            with self._cond:
                self._watches.discard(watch)

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for watch in [w for w in self._watches if w.due <= now]:
                    self._watches.discard(watch)
                    watch.cut = True
                    _shut(watch.conn)
                next_due = min((w.due for w in self._watches), default=None)
                self._cond.wait(None if next_due is None else max(0.0, next_due - now))


def _shut(conn: Any) -> None:
    try:
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            sock.shutdown(socket.SHUT_RDWR)  # the connection's own fd stays open (libpq's)
    except Exception:  # closed already (psycopg says so in its own error): nothing to wake
        pass


class _Pool:
    """At most ``size`` connections of one process, made on demand in the caller's thread
    (so a failure to connect says why), idle ones reused newest first, broken ones
    dropped; after a fork the parent's are forgotten, never closed or used."""

    def __init__(self, connect: Any, size: int) -> None:
        self._connect = connect
        self._size = size
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._idle: list[Any] = []
        self._slots = threading.BoundedSemaphore(self._size)

    def take(self, wait_s: float) -> tuple[Any, bool] | None:
        """A connection and whether it is new; None when all are busy for ``wait_s``."""
        with self._lock:
            if self._pid != os.getpid():
                self._reset()
        if not self._slots.acquire(timeout=wait_s):
            return None
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed and not conn.broken:
                    return conn, False
        try:
            return self._connect(), True
        except BaseException:
            self._slots.release()
            raise

    def give_back(self, conn: Any, *, keep: bool) -> None:
        if keep and not conn.closed and not conn.broken:
            with self._lock:
                self._idle.append(conn)
        else:
            _close(conn)
        self._slots.release()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            _close(conn)


def _close(conn: Any) -> None:
    try:
        conn.close()
    except Exception:  # a dead socket: closing it is best effort
        pass


class ResultsStore:
    """Records and finished jobs in PostgreSQL; see the module docstring."""

    def __init__(self, url: str, *, connect_timeout_s: int = 3, timeout_s: float = 5.0,
                 pool_size: int = 4):
        self._url = url
        self.where = mask_url(url)
        self._timeout = connect_timeout_s
        self.timeout_s = timeout_s
        self.deadline_s = timeout_s + GRACE_S  # a statement's longest wait, at most
        self._pool = _Pool(self._connect, pool_size)
        self._deadlines = _Deadlines()
        self._schema_ok = False

    def __repr__(self) -> str:
        return f"ResultsStore({self.where!r})"

    # --- plumbing -------------------------------------------------------------------------
    def _error(self, error: BaseException | str) -> ResultsStoreError:
        # psycopg's own text names host and port, never the password; mask it anyway in case
        # a driver version echoes the conninfo.
        text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        password = urlsplit(self._url).password
        if password:
            text = text.replace(password, "***")
        return ResultsStoreError(f"results store {self.where}: {text}")

    def _connect(self) -> Any:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        # TCP keepalives find a dead peer of an idle connection (first probe after 10 s, then
        # 3 more 5 s apart); tcp_user_timeout one that does not acknowledge what was sent.
        # What the URL says itself wins.
        given = conninfo_to_dict(self._url)
        params: dict[str, Any] = {k: v for k, v in {
            "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
            "keepalives_count": 3, "tcp_user_timeout": int(self.deadline_s * 1000),
            "connect_timeout": self._timeout}.items() if k not in given}
        conn = psycopg.connect(self._url, autocommit=True, **params)
        # A record's copy need not wait for the disk: Redis holds it until its job's end,
        # which copies whatever PostgreSQL lost (a crash of the server loses at most its
        # last moments of commits). The job's row, written last, commits synchronously
        # (put_job). See docs/results-store.md for what a record's write costs.
        conn.execute(f"SET synchronous_commit = off; SET statement_timeout = "
                     f"{int(self.timeout_s * 1000)}")
        return conn

    def _run(self, work: Any) -> Any:
        """``work(cursor)`` on a connection of the pool (the schema made on first use); once
        more on a new connection when one that had worked turns out dropped (a restart)."""
        try:
            import psycopg
        except ImportError:
            raise ResultsStoreError(f"results store {self.where}: psycopg is not installed "
                                    "(pip install 'drover[postgres]')") from None

        for attempt in (0, 1):
            try:
                taken = self._pool.take(self.deadline_s)
            except psycopg.Error as error:  # could not connect: say why
                raise self._error(error) from None
            if taken is None:
                raise self._error(f"all connections busy for {self.deadline_s:g} s")
            conn, fresh = taken
            watch = None
            try:
                with self._deadlines.watch(conn, self.deadline_s) as watch:
                    if not self._schema_ok:
                        self._create_schema(conn)
                    with conn.cursor() as cur:
                        out = work(cur)
                self._pool.give_back(conn, keep=not watch.cut)
                return out
            except psycopg.Error as error:
                self._pool.give_back(conn, keep=not (watch and watch.cut))
                if watch is not None and watch.cut:
                    raise self._error(f"no answer within {self.deadline_s:g} s (the "
                                      "connection was cut)") from None
                # Once more only when a connection that had worked dropped (a restart): a
                # server that refuses a new one, or a statement it refused, is not tried again.
                if attempt or fresh or not isinstance(error, psycopg.OperationalError) \
                        or not conn.broken:
                    raise self._error(error) from None
                self._pool.close()  # its idle ones went with it, most likely
            except BaseException:
                self._pool.give_back(conn, keep=False)
                raise
        raise AssertionError("unreachable")

    def _create_schema(self, conn: Any) -> None:
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_ID,))
            cur.execute(SCHEMA_SQL)
        self._schema_ok = True

    def close(self) -> None:
        self._pool.close()

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

    def forget(self, job_id: str, indexes: list[int]) -> None:
        """Before ``drover retry`` re-runs these sub-agents: their records and the job's row
        go, so that the retry's records and the job's new end are written in their place
        (writes never overwrite: a second write of one record is a no-op)."""
        def work(cur: Any) -> None:
            with cur.connection.transaction():
                cur.execute("DELETE FROM drover_records WHERE job_id = %s AND idx = ANY(%s)",
                            (job_id, indexes))
                cur.execute("DELETE FROM drover_jobs WHERE job_id = %s", (job_id,))

        self._run(work)

    # --- reads ----------------------------------------------------------------------------
    def indexes(self, job_id: str) -> set[int]:
        """The indexes of the job's records that are here."""
        return {int(i) for (i,) in self._run(lambda cur: cur.execute(
            "SELECT idx FROM drover_records WHERE job_id = %s", (job_id,)).fetchall())}

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
