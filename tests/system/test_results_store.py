"""The durable results store (DROVER_RESULTS_URL): real worker processes, a real PostgreSQL
(a database of the test's own), the simulator over HTTP.

Each record reaches PostgreSQL once, even with a worker killed -9 mid-job; a job whose Redis
keys are gone answers from PostgreSQL as it did from Redis (``JobHandle``, ``drover result``,
``drover jobs --finished``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from drover import JobHandle, JobSpec, submit
from drover.errors import ResultsStoreError
from drover.workers.jobs.results_db import SCHEMA_VERSION, ResultsStore
from tests.helpers import ROOT, configure, wait_until
from tests.helpers.fleet import Fleet, kill_group, submit_elsewhere
from tests.helpers.postgres import own_database

THREADS = 8


@pytest.fixture
def results_url(drover_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with own_database() as url:
        configure(monkeypatch, drover_env, results_url=url)
        yield url


@pytest.fixture
def own_keys(drover_env: dict[str, str], key_prefix: str, monkeypatch: pytest.MonkeyPatch
             ) -> str:
    """A key prefix of the test's own, for a test that counts the jobs the store is behind on
    or leaves one there: that list ({prefix}:results:pending) is the prefix's, and under the
    session's prefix it held the jobs of every earlier test in the process whose store was
    away (test_a_worker_whose_store_does_not_answer's stays on it for good), so a count
    said 2 where the test had made 1. Asked for before ``fleet``, which reads the prefix."""
    configure(monkeypatch, drover_env, key_prefix=key_prefix)
    return key_prefix


@pytest.fixture
def fleet(drover_env: dict[str, str]) -> Iterator[Fleet]:
    f = Fleet(drover_env)
    yield f
    f.close()


def rows(url: str, sql: str, *args: object) -> list[tuple]:
    import psycopg

    with psycopg.connect(url) as conn:
        return conn.execute(sql, args).fetchall()


def drover(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "drover.orchestrator.cli", *args],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, **env},
                          timeout=60)


def test_records_reach_postgres_once_each_after_a_worker_is_killed_mid_job(
        sim, drover_env, results_url, spawn_worker, monkeypatch, fleet):
    configure(monkeypatch, drover_env, max_attempts=15, countdown_cap_s=5)
    sim.configure(latency_mean_s=0.5, latency_p95_s=1.0, output_tokens_mean=20, tool_turns=2,
                  tools_per_turn=1)
    n = 60
    handle = submit_elsewhere(drover_env, JobSpec(
        subtasks=[f"Inspect pier {i}" for i in range(n)], tools=["lookup_fact"], max_tokens=60))
    victim = spawn_worker(concurrency=THREADS)
    survivor = spawn_worker(concurrency=THREADS)
    victim_id, _ = fleet.wait_for(victim, survivor)
    wait_until("the job under way and the victim busy", lambda: handle.progress()["ok"] >= 3
               and len(fleet.held(victim_id)) >= 4, 120)
    kill_group(victim)  # SIGKILL: mid-job, between any two writes
    victim.wait()
    result = fleet.wait(handle, n, timeout=120)
    assert result.status == "done" and result.counts["ok"] == n

    redis_records = {r.index: r for r in handle.records()}
    assert sorted(redis_records) == list(range(n))
    stored = rows(results_url, "SELECT idx, record FROM drover_records WHERE job_id = %s "
                  "ORDER BY idx", handle.id)
    assert [idx for idx, _ in stored] == list(range(n))  # once each: (job_id, idx) is the key
    for idx, record in stored:
        assert type(redis_records[idx]).model_validate(record) == redis_records[idx]
    (job,) = rows(results_url, "SELECT status, n, usage, spec FROM drover_jobs WHERE "
                  "job_id = %s", handle.id)
    assert job[:2] == ("done", n)
    assert job[2] == json.loads(result.usage.model_dump_json())
    assert job[3]["tools"] == ["lookup_fact"]


def test_a_job_reads_back_from_postgres_after_its_redis_keys_are_gone(
        sim, drover_env, results_url, spawn_worker, fleet):
    n = 12
    handle = submit_elsewhere(drover_env, JobSpec(
        subtasks=[f"Name harbour {i}" for i in range(n)], max_tokens=60))
    spawn_worker(concurrency=THREADS)
    before = fleet.wait(handle, n, timeout=120)
    bare = handle.wait(timeout=5, records=False)  # the handle holds no record: it pages
    assert bare.results == [] and bare.counts == before.counts and bare.usage == before.usage
    assert list(handle.records()) == before.results
    report = handle.report(3)
    transcript = handle.transcript(3)
    cli_before = drover(drover_env, "result", handle.id, "--json")
    assert cli_before.returncode == 0, cli_before.stderr

    keys = list(fleet.r.scan_iter(f"{fleet.prefix}:job:{handle.id}:*", count=1000))
    assert keys
    fleet.r.delete(*keys)  # what the TTL does a week later
    assert not fleet.r.exists(f"{fleet.prefix}:job:{handle.id}:meta")

    old = JobHandle.attach(handle.id)
    assert old.status == "done"
    assert old.result() == before
    assert old.wait(timeout=5) == before
    assert old.wait(timeout=5, records=False) == bare
    assert list(old.records()) == before.results
    assert list(old.as_completed(timeout=5)) == before.results  # index order, from there
    assert old.record(5) == before.results[5]
    assert old.report(3) == report and report.findings
    assert old.transcript(3) == transcript
    assert old.progress()["ok"] == n and old.progress()["pending"] == 0

    cli_after = drover(drover_env, "result", handle.id, "--json")
    assert cli_after.returncode == 0, cli_after.stderr
    assert json.loads(cli_after.stdout) == json.loads(cli_before.stdout)
    listed = drover(drover_env, "jobs", "--finished", "5")
    assert listed.returncode == 0, listed.stderr
    assert handle.id in listed.stdout


def test_a_refused_duplicate_record_is_not_written(drover_env, results_url):
    from drover.workers.jobs.records import SubagentResult
    from drover.workers.services import services

    store = services().store
    job_id = f"dup-{time.time_ns()}"
    first = SubagentResult(job_id=job_id, index=0, status="ok", summary="first")
    second = SubagentResult(job_id=job_id, index=0, status="failed", summary="second")
    assert store.records.put(first) == first
    assert store.records.put(second) == first  # Redis refuses it: the first record stays
    assert store.archive.flush()  # the writer thread's copy
    assert rows(results_url, "SELECT status, record->>'summary' FROM drover_records "
                "WHERE job_id = %s", job_id) == [("ok", "first")]
    store.r.delete(*store.r.keys(f"{store.prefix}:job:{job_id}:*"))


def test_the_same_record_written_twice_to_postgres_is_one_row(drover_env, results_url):
    """(job_id, idx) is the table's key: a second write of a record (a retry after a lost
    reply, the end-of-job copy of one already there) leaves the one row as it was."""
    from drover.workers.jobs.records import SubagentResult

    store = ResultsStore(results_url)
    store.check()
    job_id = f"twice-{time.time_ns()}"
    record = SubagentResult(job_id=job_id, index=0, status="ok", summary="once")
    try:
        assert store.put_records([(record, None)]) == 1
        assert store.put_records([(record, b"final")]) == 0
        assert store.put_records([(record.model_copy(update={"summary": "again"}), None),
                                  (record.model_copy(update={"index": 1}), None)]) == 1
    finally:
        store.close()
    assert rows(results_url, "SELECT idx, record->>'summary', final FROM drover_records "
                "WHERE job_id = %s ORDER BY idx", job_id) == [(0, "once", None),
                                                              (1, "once", None)]


def test_a_pending_job_whose_redis_result_expired_leaves_the_pending_list(drover_env):
    """A job whose end the store missed waits on the pending list for the sweep to copy it;
    one whose Redis result is gone meanwhile (its TTL ran out first) has nothing left to copy
    and leaves the list, while a store that is still away keeps the others on it. No
    PostgreSQL needed: the store is never reached for a job with nothing to copy."""
    from drover.workers.services import services

    store = services().store
    live = store.archive.store
    store.archive.store = ResultsStore("postgresql://drover:s3cret-pw@127.0.0.1:1/x",
                                       connect_timeout_s=1)
    expired = f"expired-{time.time_ns()}"
    try:
        store.r.zadd(store.keys.results_pending, {expired: time.time()})
        assert store.r.get(store.keys.job(expired, "result")) is None  # expired
        assert store.outcomes.keep_pending() == []  # nothing copied
        assert store.r.zscore(store.keys.results_pending, expired) is None, (
            "a pending job whose Redis result had expired stayed on the pending list")
    finally:
        store.archive.store = live
        store.r.zrem(store.keys.results_pending, expired)


def test_the_schema_is_versioned_and_runs_again_from_the_cli(drover_env, results_url):
    store = ResultsStore(results_url)
    store.check()
    assert store.schema_version() == SCHEMA_VERSION
    store.close()
    printed = drover(drover_env, "results-schema")
    assert printed.returncode == 0 and "drover_schema_version" in printed.stdout
    import psycopg

    with psycopg.connect(results_url, autocommit=True) as conn:
        conn.execute(printed.stdout)  # again, on a database that has it: a no-op
        assert conn.execute("SELECT version FROM drover_schema_version").fetchall() == [
            (SCHEMA_VERSION,)]


def test_a_results_store_that_does_not_answer_never_shows_its_password(drover_env):
    store = ResultsStore("postgresql://drover:s3cret-pw@127.0.0.1:1/results",
                         connect_timeout_s=1)
    with pytest.raises(ResultsStoreError) as caught:
        store.check()
    assert "s3cret-pw" not in str(caught.value) and "***" in str(caught.value)
    assert "s3cret-pw" not in repr(store)


def test_records_the_store_missed_are_copied_when_the_job_ends(drover_env, results_url, caplog,
                                                               monkeypatch):
    """A record written while PostgreSQL did not answer stays in Redis, with one warning
    line, and the job's end copies it."""
    from drover.workers.jobs import archive
    from drover.workers.jobs.records import JobResult, SubagentResult, Usage, status_counts
    from drover.workers.services import services

    monkeypatch.setattr(archive, "_warned", [0.0])  # its once-a-minute line is this test's

    store = services().store
    live = store.archive.store
    live.check()  # the schema made, as a worker's start does
    job_id = f"late-{time.time_ns()}"
    store.specs.create(job_id, JobSpec(subtasks=["a", "b"]), ["a", "b"], status="running",
                       queue="q")
    store.archive.store = ResultsStore("postgresql://drover:s3cret-pw@127.0.0.1:1/x",
                                       connect_timeout_s=1)
    try:
        records = [SubagentResult(job_id=job_id, index=i, status="ok", summary=f"r{i}")
                   for i in range(2)]
        with caplog.at_level("WARNING", logger="drover.workers.jobs.store"):
            for record in records:
                store.records.put(record)
            assert store.archive.flush()
        assert store.records.all(job_id) == {0: records[0], 1: records[1]}  # in Redis: not lost
        assert "s3cret-pw" not in caplog.text and "stay in Redis" in caplog.text
    finally:
        store.archive.store, store.archive._down_until = live, 0.0
    assert rows(results_url, "SELECT count(*) FROM drover_records WHERE job_id = %s",
                job_id) == [(0,)]
    store.outcomes.save(JobResult(job_id=job_id, status="done", results=records,
                                  counts=status_counts(records), usage=Usage(), wall_s=1.0))
    assert rows(results_url, "SELECT idx FROM drover_records WHERE job_id = %s ORDER BY idx",
                job_id) == [(0,), (1,)]
    assert rows(results_url, "SELECT status, n FROM drover_jobs WHERE job_id = %s",
                job_id) == [("done", 2)]
    store.r.delete(*store.r.keys(f"{store.prefix}:job:{job_id}:*"))


def test_a_worker_whose_store_does_not_answer_says_so_in_one_line_and_runs_on(
        sim, drover_env, own_keys, fleet):
    env = {**os.environ, **drover_env,
           "DROVER_RESULTS_URL": "postgresql://drover:s3cret-pw@127.0.0.1:1/results"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "drover.workers.app", "worker", "--pool",
         "threads", "--concurrency", "4", "--queues", env["DROVER_QUEUE"], "--loglevel", "INFO",
         "--without-gossip", "--without-mingle", "-n", f"pg-{time.time_ns()}@%h"],
        cwd=ROOT, env=env, start_new_session=True, stderr=subprocess.PIPE, text=True)
    try:
        handle = submit_elsewhere(drover_env, JobSpec(subtasks=["one", "two", "three"],
                                                      max_tokens=40))
        result = fleet.wait(handle, 3, timeout=120)
        assert result.status == "done" and result.counts["ok"] == 3  # in Redis as ever
    finally:
        kill_group(proc)
        log = proc.stderr.read()
        proc.wait()
    said = [line for line in log.splitlines() if "results store" in line]
    assert len([line for line in said if "runs on" in line]) == 1, said
    assert "s3cret-pw" not in log and "Traceback" not in log
    assert "postgresql://drover:***@127.0.0.1:1/results" in said[0]


def test_a_cancelled_jobs_bulk_records_reach_postgres_once_each(
        sim, drover_env, results_url, spawn_worker, fleet):
    sim.configure(latency_mean_s=0.5, latency_p95_s=1.0, output_tokens_mean=20)
    n = 80
    handle = submit_elsewhere(drover_env, JobSpec(
        subtasks=[f"Weigh crate {i}" for i in range(n)], max_tokens=40))
    spawn_worker(concurrency=4)
    wait_until("a few sub-agents done", lambda: handle.progress()["ok"] >= 2, 120)
    assert handle.cancel("enough")
    result = fleet.wait(handle, n, timeout=120)
    assert result.status == "cancelled" and result.counts["cancelled"] > 0
    stored = rows(results_url, "SELECT idx, status FROM drover_records WHERE job_id = %s "
                  "ORDER BY idx", handle.id)
    assert stored == [(r.index, r.status) for r in result.results]  # each once, as in Redis
    assert [idx for idx, _ in stored] == list(range(n))


def test_a_job_that_ended_while_the_store_was_away_is_copied_once_it_answers(
        drover_env, results_url, caplog):
    """The job's end could not reach PostgreSQL: it is listed, and the recovery sweep copies
    it (records, spec and result) once PostgreSQL answers, then no longer lists it."""
    from drover.config import get_settings
    from drover.workers.jobs.records import JobResult, SubagentResult, Usage, status_counts
    from drover.workers.recovery.sweep import sweep
    from drover.workers.services import services

    root = services()
    store = root.store
    live = store.archive.store
    live.check()
    job_id = f"away-{time.time_ns()}"
    store.specs.create(job_id, JobSpec(subtasks=["a", "b"]), ["a", "b"], status="running",
                       queue="q")
    records = [SubagentResult(job_id=job_id, index=i, status="ok", summary=f"r{i}")
               for i in range(2)]
    store.archive.store = ResultsStore("postgresql://drover:s3cret-pw@127.0.0.1:1/x",
                                       connect_timeout_s=1)
    try:
        with caplog.at_level("WARNING", logger="drover.workers.jobs.store"):
            for record in records:
                store.records.put(record)
            assert store.archive.flush()
            store.outcomes.save(JobResult(job_id=job_id, status="done", results=records,
                                          counts=status_counts(records), usage=Usage(),
                                          wall_s=1.0))
        assert "once it answers again" in caplog.text and "s3cret-pw" not in caplog.text
        assert store.outcomes.keep_pending() == []  # still away: kept on the list
        assert store.r.zscore(store.keys.results_pending, job_id) is not None
    finally:
        store.archive.store, store.archive._down_until = live, 0.0
    assert rows(results_url, "SELECT count(*) FROM drover_jobs WHERE job_id = %s",
                job_id) == [(0,)]

    store.r.delete(store.keys.recovery("archive"), store.keys.recovery("lock"))
    with caplog.at_level("WARNING", logger="drover.workers.recovery.sweep"):
        sweep(store, get_settings(), lambda *a: None, root.fairshare)
    assert f"job {job_id}: copied to the results store" in caplog.text
    assert rows(results_url, "SELECT idx FROM drover_records WHERE job_id = %s ORDER BY idx",
                job_id) == [(0,), (1,)]
    assert rows(results_url, "SELECT status, n FROM drover_jobs WHERE job_id = %s",
                job_id) == [("done", 2)]
    assert store.r.zscore(store.keys.results_pending, job_id) is None
    store.r.delete(*store.r.keys(f"{store.prefix}:job:{job_id}:*"))


# --- a database that goes silent or away (issue 52, item 4) -------------------------------

def test_a_silent_database_fails_a_statement_at_its_deadline_and_the_next_one_connects_anew(
        drover_env, results_url):
    """A connection whose peer goes silent (no FIN, no RST) is cut at the statement's deadline
    (the server's statement_timeout + 2 s) instead of holding its caller for good; a slow
    statement meets the server's own timeout; connections carry TCP keepalives."""
    from drover.workers.jobs.records import SubagentResult
    from tests.helpers.tcp_proxy import TcpProxy

    database = results_url.rpartition("/")[2]
    with TcpProxy(5432) as proxy:
        store = ResultsStore(f"postgresql://postgres@127.0.0.1:{proxy.port}/{database}",
                             timeout_s=1.0)
        try:
            store.check()
            assert store._run(lambda cur: cur.execute("SHOW statement_timeout").fetchone()) \
                == ("1s",)
            params = store._run(lambda cur: cur.connection.info.get_parameters())
            assert params["keepalives"] == "1" and params["keepalives_idle"] == "10", params
            assert params["tcp_user_timeout"] == "3000", params
            assert proxy.silence() == 1
            record = SubagentResult(job_id="silent", index=0, status="ok")
            with pytest.raises(ResultsStoreError, match=r"no answer within 3 s \(the "
                               r"connection was cut\)"):
                store.put_records([(record, None)])
            assert store.put_records([(record, None)]) == 1  # a new connection: it answers
            with pytest.raises(ResultsStoreError, match="statement timeout"):
                store._run(lambda cur: cur.execute("SELECT pg_sleep(30)"))
            assert store.record_count("silent") == 1  # the connection was kept: still usable
        finally:
            store.close()


def test_records_never_wait_on_a_silent_store_and_are_copied_once_it_answers(
        drover_env, results_url, own_keys, caplog, monkeypatch):
    """The sub-agents' record writes return while the store's writer is held by a silent
    connection; the jobs it missed are listed (the metric's count and age), and the sweep's
    catch-up copies their records once it answers."""
    from drover.workers.jobs import archive
    from drover.workers.jobs.records import SubagentResult
    from drover.workers.services import services
    from tests.helpers.tcp_proxy import TcpProxy

    monkeypatch.setattr(archive, "_warned", [0.0])  # its once-a-minute line is this test's
    store = services().store
    live = store.archive.store
    live.check()
    job_id = f"held-{time.time_ns()}"
    store.specs.create(job_id, JobSpec(subtasks=["a"] * 20), ["a"] * 20, status="running",
                       queue="q")
    database = results_url.rpartition("/")[2]
    proxy = TcpProxy(5432)
    # A deadline far beyond the puts: the writer stays held while they run.
    store.archive.store = ResultsStore(
        f"postgresql://postgres@127.0.0.1:{proxy.port}/{database}", timeout_s=60)
    try:
        store.archive.store.check()
        proxy.silence()
        records = [SubagentResult(job_id=job_id, index=i, status="ok") for i in range(20)]
        with caplog.at_level("WARNING", logger="drover.workers.jobs.store"):
            for record in records:
                store.records.put(record)  # returns: the writer holds the silent connection
            assert store.records.count(job_id) == 20
            assert store.archive._queue.unfinished_tasks > 0  # still held, records queued
            proxy.close()  # the store goes away: the held statement fails, its batch listed
            assert store.archive.flush(timeout=30)
        assert "stay in Redis and are copied once it answers" in caplog.text
        jobs, oldest_s = store.outcomes.behind()
        assert jobs == 1 and oldest_s >= 0
        assert store.r.zscore(store.keys.results_pending, job_id) is not None
    finally:
        store.archive.store.close()
        store.archive.store, store.archive._down_until = live, 0.0
        proxy.close()
    assert rows(results_url, "SELECT count(*) FROM drover_records WHERE job_id = %s",
                job_id) == [(0,)]
    assert store.outcomes.keep_pending() == [job_id]  # the store answers: the catch-up
    assert rows(results_url, "SELECT count(*) FROM drover_records WHERE job_id = %s",
                job_id) == [(20,)]
    assert store.outcomes.behind() == (0, 0.0)
    store.r.delete(*store.r.keys(f"{store.prefix}:job:{job_id}:*"))


def test_a_job_runs_on_through_a_store_gone_silent_and_every_record_reaches_it_once(
        sim, drover_env, results_url, own_keys, spawn_worker, fleet):
    """Real workers write through a TCP proxy to PostgreSQL; mid-job every connection open
    through it goes silent (no byte either way, none closed). The job ends, every sub-agent
    ok; each statement held by a silent connection is cut at its deadline and the records it
    carried are copied by the job's end or the sweep, each once."""
    from drover.workers.services import services
    from tests.helpers.tcp_proxy import TcpProxy

    sim.configure(latency_mean_s=0.4, latency_p95_s=0.8, output_tokens_mean=20)
    n = 60
    database = results_url.rpartition("/")[2]
    with TcpProxy(5432) as proxy:
        through = f"postgresql://postgres@127.0.0.1:{proxy.port}/{database}"
        handle = submit_elsewhere(drover_env, JobSpec(
            subtasks=[f"Count the gulls on pier {i}" for i in range(n)], max_tokens=40))
        for _ in range(2):
            spawn_worker(concurrency=4, DROVER_RESULTS_URL=through,
                         DROVER_RESULTS_TIMEOUT_S="1")
        wait_until("a third of the job done, its records through the proxy",
                   lambda: handle.progress()["ok"] >= n // 3 and proxy.open_connections(), 120)
        silenced = proxy.silence()
        assert silenced >= 1
        result = fleet.wait(handle, n, timeout=180)
        assert result.status == "done" and result.counts["ok"] == n
        store = services().store

        def caught_up() -> bool:
            stored = rows(results_url, "SELECT idx FROM drover_records WHERE job_id = %s "
                          "ORDER BY idx", handle.id)
            return (stored == [(i,) for i in range(n)] and store.outcomes.behind()[0] == 0
                    and rows(results_url, "SELECT count(*) FROM drover_jobs WHERE "
                             "job_id = %s", handle.id) == [(1,)])

        wait_until("every record and the job's row in PostgreSQL, nothing listed behind",
                   caught_up, 120)
    assert proxy.silenced >= silenced


def test_a_job_that_ends_while_the_store_is_away_is_caught_up_once_it_is_back(
        sim, drover_env, results_url, own_keys, fleet, tmp_path):
    """Mid-job the database stops (every connection closed, new ones refused): the job ends
    all ok on Redis alone, the workers say the store is behind, and once it is back the
    sweep copies every record and the job's row, and the list of jobs behind empties.
    Its sub-agents run at once and end within a second or so of each other, so one of them
    thinks for 10 s: the job is still running when the store goes (without it, on a loaded box
    the job had ended, copied, before the test saw a quarter of it done)."""
    from drover.workers.services import services
    from tests.helpers.tcp_proxy import TcpProxy

    sim.configure(latency_mean_s=0.3, latency_p95_s=0.6, output_tokens_mean=20)
    n = 40
    database = results_url.rpartition("/")[2]
    log = tmp_path / "worker.log"
    with TcpProxy(5432) as proxy, log.open("w") as out:
        env = {**os.environ, **drover_env, "DROVER_RESULTS_TIMEOUT_S": "1",
               "DROVER_RESULTS_URL": f"postgresql://postgres@127.0.0.1:{proxy.port}/{database}"}
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "drover.workers.app", "worker", "--pool",
             "threads", "--concurrency", "4", "--queues", env["DROVER_QUEUE"], "--loglevel",
             "WARNING", "--without-gossip", "--without-mingle", "-n", f"away-{time.time_ns()}@%h"],
            cwd=ROOT, env=env, start_new_session=True, stdout=out, stderr=subprocess.STDOUT)
        try:
            handle = submit_elsewhere(drover_env, JobSpec(
                subtasks=[f"Weigh the catch of boat {i}" for i in range(n - 1)]
                + [f"Weigh the catch of boat {n - 1} [[sim:think=10]]"], max_tokens=40))
            wait_until("a quarter of the job done", lambda: handle.progress()["ok"] >= n // 4,
                       120)
            proxy.go_down()
            assert handle.progress()["ok"] < n  # the store went away mid-job
            result = fleet.wait(handle, n, timeout=180)
            assert result.status == "done" and result.counts["ok"] == n
            store = services().store
            assert store.r.zscore(store.keys.results_pending, handle.id) is not None
            wait_until("the workers' sweep saying the store is behind",
                       lambda: "is behind: 1 job(s) not copied there yet" in log.read_text(),
                       120)
            proxy.come_back()

            def caught_up() -> bool:
                stored = rows(results_url, "SELECT idx FROM drover_records WHERE job_id = %s "
                              "ORDER BY idx", handle.id)
                return (stored == [(i,) for i in range(n)]
                        and store.outcomes.behind() == (0, 0.0)
                        and rows(results_url, "SELECT status, n FROM drover_jobs WHERE "
                                 "job_id = %s", handle.id) == [("done", n)])

            wait_until("every record and the job's row copied once the store is back",
                       caught_up, 120)
        finally:
            kill_group(worker)
            worker.wait()
    text = log.read_text()
    assert f"job {handle.id}: copied to the results store" in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]


def test_a_retry_replaces_the_stored_records_of_the_sub_agents_it_runs_again(
        sim, drover_env, results_url, spawn_worker, monkeypatch):
    # Writes to the store never overwrite (a second write of one record is a no-op): the
    # retried sub-agent's failed record and the job's first end stayed there as they were.
    configure(monkeypatch, drover_env, max_attempts=1)
    sim.configure(tool_turns=0, output_tokens_mean=20)
    spawn_worker(concurrency=4)
    handle = submit(JobSpec(subtasks=["Weigh crate 0", "Weigh crate 1 [[sim:500:1]]",
                                      "Weigh crate 2"], max_tokens=40))
    first = handle.wait(timeout=120)
    assert first.counts == {**first.counts, "ok": 2, "failed": 1}, first.counts

    def stored() -> list[tuple]:
        return rows(results_url, "SELECT idx, status FROM drover_records WHERE job_id = %s "
                    "ORDER BY idx", handle.id)

    wait_until("the first run's records and end in PostgreSQL", lambda: len(stored()) == 3
               and rows(results_url, "SELECT status FROM drover_jobs WHERE job_id = %s",
                        handle.id), 60)
    assert handle.retry() == [1]
    assert handle.wait(timeout=120).counts["ok"] == 3
    wait_until("the retry's record and the job's new end in PostgreSQL",
               lambda: stored() == [(0, "ok"), (1, "ok"), (2, "ok")]
               and rows(results_url, "SELECT status FROM drover_jobs WHERE job_id = %s",
                        handle.id) == [("done",)], 60)
    (usage,) = rows(results_url, "SELECT usage FROM drover_jobs WHERE job_id = %s", handle.id)
    assert usage[0]["calls"] == 3  # the retry's call beside the first run's two
