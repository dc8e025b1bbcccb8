"""A job's meta hash (its status, size, queue, deadline, when it was created, launched and
finished) and the index of every job by creation time, with Redis's clock that deadlines
are read on."""

from __future__ import annotations

import time

import redis

from drover.errors import JobNotFound
from drover.workers.jobs._decode import members as _members
from drover.workers.jobs._decode import text as _s
from drover.workers.jobs.archive import Archive
from drover.workers.jobs.keys import JobKeys

__all__ = ["ACTIVE", "JobMeta"]

ACTIVE = ("queued", "planning", "running")  # a job's statuses before it ended


class JobMeta:
    def __init__(self, client: redis.Redis, keys: JobKeys, archive: Archive) -> None:
        self.r = client
        self.keys = keys
        self.archive = archive

    def get(self, job_id: str) -> dict[str, str]:
        """The job's meta fields (from the results store, marked ``archived``, once Redis no
        longer has the job); ``JobNotFound`` when neither has it."""
        raw = self.r.hgetall(self.keys.job(job_id, "meta"))
        if not raw and self.archive.store is not None:
            row = self.archive.job(job_id)
            if row is not None:
                return {"status": row["status"], "n": str(row["n"]),
                        "created": str(row["created_at"] or ""),
                        "finished": str(row["finished_at"]), "archived": "1"}
        if not raw:
            raise JobNotFound(f"no job {job_id!r} in Redis (wrong id, or its records expired)")
        return {_s(k): _s(v) for k, v in raw.items()}

    def many(self, job_ids: list[str], *fields: str) -> list[list[str | None]]:
        """Some meta fields of many jobs in one round trip (None where a job or field is gone)."""
        if not job_ids:
            return []
        pipe = self.r.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hmget(self.keys.job(job_id, "meta"), *fields)
        return [[_s(v) if v is not None else None for v in row] for row in pipe.execute()]

    def recent(self, limit: int = 20) -> list[str]:
        """The ids of the ``limit`` newest jobs, newest first."""
        return _members(self.r.zrevrange(self.keys.jobs, 0, limit - 1))

    def claim_launch(self, job_id: str) -> bool:
        """True for the one caller that may send the job's chord (a replanned job is not resent)."""
        pipe = self.r.pipeline()
        pipe.hsetnx(self.keys.job(job_id, "meta"), "launched", time.time())
        pipe.hset(self.keys.job(job_id, "meta"), "status", "running")
        return bool(pipe.execute()[0])

    def deadline_in(self, job_id: str) -> float | None:
        """Seconds until the job's deadline (<= 0 once passed); None when it has none."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hget(self.keys.job(job_id, "meta"), "deadline")
        pipe.time()
        deadline, (seconds, micros) = pipe.execute()
        return None if not deadline else float(deadline) - (seconds + micros / 1e6)

    def server_time(self) -> float:
        """Redis's clock, which every deadline and age of a job is read on."""
        seconds, micros = self.r.time()
        return seconds + micros / 1e6
