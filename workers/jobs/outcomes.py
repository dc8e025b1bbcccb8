"""A job's outcome: its ``JobResult`` (kept without its records, which it reads by reference
from the records hash), copied to the results store when the job ends."""

from __future__ import annotations

import time

import redis

from drover.errors import JobNotFound, JobRefused, ResultsStoreError
from drover.workers.jobs._decode import members as _members
from drover.workers.jobs._decode import text as _s
from drover.workers.jobs._stored import PAGE
from drover.workers.jobs.archive import Archive, warn
from drover.workers.jobs.claims import LUA
from drover.workers.jobs.keys import JobKeys
from drover.workers.jobs.meta import JobMeta
from drover.workers.jobs.record_store import Records
from drover.workers.jobs.records import JobResult, SubagentResult, Usage, compact, status_counts
from drover.workers.jobs.specs import Specs

__all__ = ["Outcomes"]


class Outcomes:
    def __init__(self, client: redis.Redis, keys: JobKeys, ttl_s: int, *, archive: Archive,
                 records: Records, specs: Specs, meta: JobMeta) -> None:
        self.r = client
        self.keys = keys
        self.ttl_s = ttl_s
        self.archive = archive
        self._reopen = client.register_script((LUA / "reopen.lua").read_text())
        self.records = records
        self.specs = specs
        self.meta = meta

    def save(self, result: JobResult) -> None:
        """Store the job's result without its records (``get`` reads them from the records
        hash, by reference: the answers are not stored twice)."""
        stored = result.model_copy(update={"results": [], "by_reference": True})
        pipe = self.r.pipeline()
        pipe.set(self.keys.job(result.job_id, "result"), stored.model_dump_json(), ex=self.ttl_s)
        pipe.hset(self.keys.job(result.job_id, "meta"),
                  mapping={"status": result.status, "finished": time.time()})
        if self.archive.store is not None:
            # Listed as not copied in the same write as its end, taken off once the copy
            # below is done: an ended job is never on neither (listed only after a failed
            # copy, a worker killed in between left it out of the store for good, and a
            # reader in between saw it ended and not listed).
            self.archive.list_behind(pipe, {result.job_id})
        pipe.execute()
        if self.archive.store is not None:
            try:
                self._keep_job(result)
            except ResultsStoreError as error:
                warn(f"{error}; job {result.job_id} is copied there once it answers again "
                     "(Redis keeps the job meanwhile, for its TTL)", each_time=True)
            else:
                self.r.zrem(self.keys.results_pending, result.job_id)  # copied: off the list

    def keep_pending(self, limit: int = 50) -> list[str]:
        """Copy to the results store what it missed (it did not answer then), oldest first,
        until a copy fails (it is still away); returns the jobs caught up. An ended job gets
        its missing records and its row; a running one its missing records so far (the rest
        go as usual, its end writes the row). A job Redis no longer has (its TTL ran out
        first) is dropped from the list."""
        if self.archive.store is None:
            return []
        copied = []
        for job_id in _members(self.r.zrange(self.keys.results_pending, 0, limit - 1)):
            stored = self.r.get(self.keys.job(job_id, "result"))
            try:
                if stored:
                    self._keep_job(JobResult.model_validate_json(stored))
                elif self.r.exists(self.keys.job(job_id, "meta")):
                    self._keep_records(job_id)
                else:
                    self.r.zrem(self.keys.results_pending, job_id)
                    continue
            except ResultsStoreError:
                break
            copied.append(job_id)
            self.r.zrem(self.keys.results_pending, job_id)
        return copied

    def behind(self) -> tuple[int, float]:
        """How many jobs the store is behind on, and for how long the oldest (s)."""
        pipe = self.r.pipeline()
        pipe.zcard(self.keys.results_pending)
        pipe.zrange(self.keys.results_pending, 0, 0, withscores=True)
        count, oldest = pipe.execute()
        return int(count), max(0.0, time.time() - oldest[0][1]) if oldest else 0.0

    def _keep_records(self, job_id: str) -> int:
        """Copy the job's records that Redis holds and the store lacks (one written while the
        store did not answer, or lost with a worker killed between its two writes)."""
        assert self.archive.store is not None
        n = int(self.r.hget(self.keys.job(job_id, "meta"), "n") or 0)
        missing = sorted(set(range(n)) - self.archive.store.indexes(job_id))
        copied = 0
        for start in range(0, len(missing), PAGE):
            indexes = [str(i) for i in missing[start:start + PAGE]]
            raws = self.r.hmget(self.keys.job(job_id, "records"), indexes)
            finals = self.r.hmget(self.keys.job(job_id, "final"), indexes)
            copied += self.archive.store.put_records(
                (SubagentResult.model_validate_json(raw),
                 final if isinstance(final, bytes) else (final.encode() if final else None))
                for raw, final in zip(raws, finals, strict=True) if raw)
        return copied

    def _keep_job(self, result: JobResult) -> None:
        """The job's end in the results store: first every record Redis holds that is not
        there yet, then the job's spec, usage and result."""
        assert self.archive.store is not None
        job_id = result.job_id
        meta = {_s(k): _s(v) for k, v in self.r.hgetall(self.keys.job(job_id, "meta")).items()}
        n = int(meta.get("n") or 0)
        self._keep_records(job_id)
        spec = self.r.get(self.keys.job(job_id, "spec"))
        self.archive.store.put_job(result, spec=_s(spec) if spec else None,
                                   subtasks=self.specs.subtasks(job_id), n=n,
                                   created=float(meta["created"]) if meta.get("created")
                                   else None,
                                   finished=float(meta.get("finished") or time.time()))

    def get(self, job_id: str, *, records: bool = True) -> JobResult | None:
        """The job's result, its records read a page at a time from the records hash and cut
        to its ``record_chars`` (``records=False``: without them, one read)."""
        raw = self.r.get(self.keys.job(job_id, "result"))
        if not raw and self.archive.gone(job_id):
            archived = self.archive.store.result(job_id)  # type: ignore[union-attr]
            if archived is not None and records:
                archived.results = [compact(r, archived.record_chars)
                                    for r in self.archive.store.iter_records(job_id)]  # type: ignore[union-attr]
            return archived
        if not raw:
            return None
        result = JobResult.model_validate_json(raw)
        if result.by_reference:
            result.by_reference = False
            if records:
                n = int(self.r.hget(self.keys.job(job_id, "meta"), "n") or 0)
                result.results = [compact(r, result.record_chars)
                                  for _, r in self.records.walk(job_id, n) if r is not None]
        return result

    def reopen(self, job_id: str, deadline_s: float | None = None) -> list[int]:
        """Open a finished job again to re-run its sub-agents that did not end ok
        (``lua/reopen.lua``): their records go, their usage moves to the job's own usage
        (every call stays counted once), and the job runs again (a new deadline of
        ``deadline_s`` if it has one). Returns their indexes (none: every one was ok).

        JobNotFound for an unknown job, JobRefused for one still running or that never
        fanned out."""
        self._forget_archived(job_id)
        keys = [self.keys.job(job_id, part) for part in (
            "meta", "records", "counts", "final", "claims", "sent", "result", "usage")]
        reply = self._reopen(keys=keys, args=["" if deadline_s is None else deadline_s,
                                              self.ttl_s])
        code = int(reply[0])
        if code == -1:
            raise JobNotFound(f"no job {job_id!r} in Redis (wrong id, or its records expired): "
                              "nothing to retry")
        if code == -2:
            raise JobRefused(f"job {job_id} is still {_s(reply[1])}: wait for it to end (or "
                             f"cancel it: `drover cancel {job_id}`), then retry it")
        if code == -3:
            raise JobRefused(f"job {job_id} has no sub-agents (its planning failed): submit "
                             "it again")
        return sorted(int(_s(i)) for i in reply[1:])

    def _forget_archived(self, job_id: str) -> None:
        """With a results store: take out its copies of the records a retry replaces, and the
        job's row, before the retry runs (its records and the job's end are then written
        afresh; a copy left there would have stayed, as writes never overwrite). JobRefused,
        with nothing changed, when the store does not answer."""
        store = self.archive.store
        meta = self.meta.get(job_id)
        if store is None or meta.get("status") in ("queued", "planning", "running"):
            return  # nothing kept elsewhere, or reopen refuses a running job
        n = int(meta.get("n") or 0)
        rerun = [i for i, r in self.records.walk(job_id, n) if r is not None and r.status != "ok"]
        if not rerun:
            return
        try:
            store.forget(job_id, rerun)
        except ResultsStoreError as error:
            raise JobRefused(f"job {job_id} keeps its records in the results store, which "
                             f"does not answer ({error}); the retry would leave the old records "
                             "there: retry once it answers") from None

    def exists(self, job_id: str) -> bool:
        if self.r.exists(self.keys.job(job_id, "result")):
            return True
        return self.archive.gone(job_id) and self.archive.store.job(job_id) is not None  # type: ignore[union-attr]

    def fail(self, job_id: str, reason: str, status: str = "failed") -> None:
        """End a job that never fanned out (its planning failed or it was cancelled first)."""
        created = float(self.meta.get(job_id).get("created", time.time()))
        self.save(JobResult(job_id=job_id, status=status,  # type: ignore[arg-type]
                            reason=reason, results=[],
                            counts=status_counts([]), usage=Usage(),
                            wall_s=round(time.time() - created, 3)))
