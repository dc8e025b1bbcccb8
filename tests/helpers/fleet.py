"""A fleet of worker processes as Redis sees it: whose heartbeats beat and which parts each
worker's claims hold (for the tests that kill, pause or stop workers)."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import time

from drover import JobHandle, JobSpec
from drover.workers.connections.redis_clients import sync_redis
from tests.helpers import ROOT, wait_until

__all__ = ["SHORT_BROKER_TIMEOUTS", "VISIBILITY_TIMEOUT_S", "Fleet", "assert_complete",
           "kill_group", "submit_elsewhere"]

# Broker timeouts short enough that a lost message comes back within a test (the visibility
# timeout is Redis's redelivery), for the tests that restart Redis or fail it over.
VISIBILITY_TIMEOUT_S = 15
SHORT_BROKER_TIMEOUTS = {"visibility_timeout_s": VISIBILITY_TIMEOUT_S, "countdown_cap_s": 3,
                         "task_time_limit_s": 10, "call_timeout_s": 5, "resend_after_s": 5}


class Fleet:
    """What Redis says about the workers of this test: heartbeats and claims."""

    def __init__(self, env: dict[str, str]):
        self.r = sync_redis(env["DROVER_REDIS_URL"], master=env.get("DROVER_SENTINEL_MASTER"),
                            decode_responses=True)
        self.prefix = env["DROVER_KEY_PREFIX"]

    def worker_of(self, proc: subprocess.Popen) -> str | None:
        for worker in self.r.zrange(f"{self.prefix}:workers", 0, -1):
            if worker.split(":")[-2] == str(proc.pid) and self.r.exists(
                    f"{self.prefix}:worker:{worker}"):
                return worker
        return None

    def wait_for(self, *procs: subprocess.Popen) -> list[str]:
        return wait_until("every worker's heartbeat", lambda: (
            ids if all(ids := [self.worker_of(p) for p in procs]) else None), 60)

    def held(self, worker: str) -> set[tuple[str, str]]:
        fields = self.r.hkeys(f"{self.prefix}:worker:{worker}:claims")
        return {tuple(f.rsplit("|", 1)) for f in fields}  # type: ignore[misc]

    def running(self, worker: str) -> set[tuple[str, str]]:
        """The parts ``worker`` runs right now (not only holds)."""
        return {(job, part) for job, part in self.held(worker)
                if (self.r.hget(f"{self.prefix}:job:{job}:claims", part) or "").endswith(
                    f"|running|{worker}")}

    def moved_on(self, job_id: str, part: str, gone: str) -> bool:
        """The part finished, or another worker runs or holds it now."""
        if self.r.hexists(f"{self.prefix}:job:{job_id}:records", part):
            return True
        claim = self.r.hget(f"{self.prefix}:job:{job_id}:claims", part) or ""
        _token, state, holder = (claim.split("|") + ["", ""])[:3]
        return state in ("running", "held") and holder not in ("", gone)

    def records_written(self, job_id: str) -> collections.Counter:
        entries = self.r.xrange(f"{self.prefix}:job:{job_id}:events")
        # An entry names its record by index ("i"); older entries carried the record.
        return collections.Counter(int(fields["i"]) if "i" in fields
                                   else json.loads(fields["record"])["index"]
                                   for _id, fields in entries)

    def explain(self, job_id: str, n: int) -> str:
        """The claims of the sub-agents that have no record (for a failure message)."""
        records = set(self.r.hkeys(f"{self.prefix}:job:{job_id}:records"))
        claims = self.r.hgetall(f"{self.prefix}:job:{job_id}:claims")
        live = {w for w in self.r.zrange(f"{self.prefix}:workers", 0, -1)
                if self.r.exists(f"{self.prefix}:worker:{w}")}
        resent = self.r.hgetall(f"{self.prefix}:job:{job_id}:resent")
        broker = self._in_broker(job_id)
        mutex = self.r.pttl(f"{self.prefix}:celery:unacked_mutex")
        return "; ".join(f"{i}: claim={claims.get(str(i))!r} resent={resent.get(str(i))} "
                         f"broker={broker.get(i, 'nowhere')}"
                         for i in range(n) if str(i) not in records) + (
            f" (live: {live}; kombu's unacked_mutex pttl {mutex} ms)")

    def _in_broker(self, job_id: str) -> dict[int, str]:
        """Where the Redis broker holds each of the job's sub-agent messages: queued, or
        unacked since how long (kombu's layout under the test's key prefix)."""
        from drover.workers.recovery.sweep import subagent_of

        base = f"{self.prefix}:celery:"
        found: dict[int, str] = {}
        now = time.time()
        for key in self.r.scan_iter(f"{base}*"):
            if self.r.type(key) == "list":
                for raw in self.r.lrange(key, 0, -1):
                    with contextlib.suppress(ValueError, TypeError, KeyError, IndexError):
                        if (part := subagent_of(json.loads(raw))) and part[0] == job_id:
                            found[part[1]] = f"queued in {key[len(base):]}"
        since = dict(self.r.zrange(f"{base}unacked_index", 0, -1, withscores=True))
        for tag, raw in self.r.hgetall(f"{base}unacked").items():
            with contextlib.suppress(ValueError, TypeError, KeyError, IndexError):
                if (part := subagent_of(json.loads(raw)[0])) and part[0] == job_id:
                    found[part[1]] = f"unacked for {now - since.get(tag, now):.0f} s"
        return found

    def wait(self, handle: JobHandle, n: int, timeout: float):
        try:
            return handle.wait(timeout=timeout)
        except TimeoutError as error:
            raise AssertionError(f"{error}; without a record: {self.explain(handle.id, n)}"
                                 ) from None

    def close(self) -> None:
        self.r.close()


def submit_elsewhere(env: dict[str, str], spec: JobSpec) -> JobHandle:
    """``drover submit`` in a process of its own, which starts with this test's broker URL
    (this test process's Celery app keeps the broker it was first built with)."""
    proc = subprocess.run([sys.executable, "-m", "drover.orchestrator.cli", "submit", "-"],
                          input=spec.model_dump_json(), capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **env}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return JobHandle.attach(proc.stdout.split()[-1])


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Signal a worker started in a process group of its own, and its children (SIGKILL: no
    shutdown, no acks; SIGSTOP/SIGCONT: a partition)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def assert_complete(result, fleet: Fleet, n: int) -> None:
    """A job of ``n`` sub-agents ended done, every one ok, each record written once."""
    assert result.status == "done"
    assert [r.index for r in result.results] == list(range(n))
    assert result.counts["ok"] == n, [r.error for r in result.results if r.status != "ok"]
    written = fleet.records_written(result.job_id)
    assert sorted(written) == list(range(n)) and set(written.values()) == {1}  # once each
