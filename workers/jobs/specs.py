"""What a job was asked to do: its spec (without its subtasks) and its subtasks, a list of
their own that a sub-agent reads one of (a job of a team's own ``@subagent``: its inputs, each
as JSON text). Writing them creates the job."""

from __future__ import annotations

import json
import time

import redis
from redis.typing import EncodableT, FieldT

from drover.errors import JobNotFound
from drover.workers.jobs._decode import text as _s
from drover.workers.jobs.archive import Archive
from drover.workers.jobs.keys import JobKeys
from drover.workers.jobs.spec import JobSpec

__all__ = ["Specs"]


class Specs:
    def __init__(self, client: redis.Redis, keys: JobKeys, ttl_s: int, archive: Archive
                 ) -> None:
        self.r = client
        self.keys = keys
        self.ttl_s = ttl_s
        self.archive = archive

    def create(self, job_id: str, spec: JobSpec, subtasks: list[str], *, status: str,
               queue: str) -> None:
        """The job: its spec, its subtasks, its meta hash and its place in the job index."""
        # They go to the "tasks" list (the inputs of an @subagent job too).
        stored = spec.model_copy(update={"subtasks": [], "inputs": []})
        now = time.time()
        pipe = self.r.pipeline()
        pipe.set(self.keys.job(job_id, "spec"), stored.model_dump_json(), ex=self.ttl_s)
        if subtasks:
            pipe.rpush(self.keys.job(job_id, "tasks"), *subtasks)
            pipe.expire(self.keys.job(job_id, "tasks"), self.ttl_s)
        # The queue is where the recovery sweep re-sends lost tasks of this job.
        meta: dict[FieldT, EncodableT] = {"status": status, "n": len(subtasks),
                                          "created": now, "queue": queue}
        if spec.deadline_s:
            # On Redis's clock, like every check of it: the hosts' clocks may disagree.
            seconds, micros = self.r.time()
            meta["deadline"] = seconds + micros / 1e6 + spec.deadline_s
        pipe.hset(self.keys.job(job_id, "meta"), mapping=meta)
        pipe.expire(self.keys.job(job_id, "meta"), self.ttl_s)
        pipe.zadd(self.keys.jobs, {job_id: now})
        pipe.execute()

    def set_subtasks(self, job_id: str, subtasks: list[str]) -> None:
        """The subtasks a planned job was given (and their number in its meta)."""
        pipe = self.r.pipeline()
        pipe.delete(self.keys.job(job_id, "tasks"))
        pipe.rpush(self.keys.job(job_id, "tasks"), *subtasks)
        pipe.expire(self.keys.job(job_id, "tasks"), self.ttl_s)
        pipe.hset(self.keys.job(job_id, "meta"), mapping={"n": len(subtasks)})
        pipe.execute()

    def get(self, job_id: str) -> JobSpec:
        raw = self.r.get(self.keys.job(job_id, "spec"))
        if raw is None and self.archive.gone(job_id):
            row = self.archive.store.job(job_id)  # type: ignore[union-attr]
            if row is not None and row["spec"] is not None:
                return JobSpec.model_construct(**row["spec"])
        if raw is None:
            raise JobNotFound(f"no job {job_id!r} in Redis (wrong id, or its records expired)")
        # Validated at submit; stored without its subtasks (those live in a list of their own,
        # read one at a time), which validation would refuse.
        return JobSpec.model_construct(**json.loads(raw))

    def subtasks(self, job_id: str) -> list[str]:
        return [_s(x) for x in self.r.lrange(self.keys.job(job_id, "tasks"), 0, -1)]
