"""A job's records: one per sub-agent, stored once (``lua/record.lua``) with the job's status
counters, the stream's entry and the sub-agent's final state; read a page at a time, and from
the results store once Redis no longer has the job."""

from __future__ import annotations

from collections.abc import Iterator

import redis

from drover.workers.jobs._decode import text as _s
from drover.workers.jobs._stored import PAGE, compact_json, pack_final, unpack_final
from drover.workers.jobs.archive import Archive
from drover.workers.jobs.claims import LUA, ClaimLost
from drover.workers.jobs.keys import JobKeys
from drover.workers.jobs.records import (
    STATUSES,
    Checkpoint,
    SubagentReport,
    SubagentResult,
    status_counts,
)

__all__ = ["PAGE", "Records"]


class Records:
    def __init__(self, client: redis.Redis, keys: JobKeys, ttl_s: int, archive: Archive
                 ) -> None:
        self.r = client
        self.keys = keys
        self.ttl_s = ttl_s
        self.archive = archive
        self._record = client.register_script((LUA / "record.lua").read_text())

    def put(self, result: SubagentResult, report: SubagentReport | None = None, *,
               token: int = 0, worker: str = "") -> SubagentResult:
        """Store a sub-agent's record once; a second delivery gets the first record back.

        With a claim ``token`` the record is stored only while that token is the claim
        (``ClaimLost`` otherwise); the claim ends with the record.
        """
        return self.put_counted(result, report, token=token, worker=worker)[0]

    def put_counted(self, result: SubagentResult, report: SubagentReport | None = None, *,
                       token: int = 0, worker: str = "", checkpoint: Checkpoint | None = None
                       ) -> tuple[SubagentResult, int | None]:
        """``put``, and the job's record count just after this record was stored (None
        when it was there already): what the fair-share refill needs, in the same round trip.
        With ``checkpoint``, the sub-agent's final state is stored with the record (its
        transcript, ``JobHandle.transcript``: the last reply is saved nowhere else).
        """
        job_id, index = result.job_id, result.index
        raw = compact_json(result)
        if checkpoint is None and report is not None:  # a report with no state: kept as one
            checkpoint = Checkpoint(messages=[{"role": "assistant", "content": [
                {"type": "text", "text": report.findings}]}], tried=report.tried,
                failed=report.failed)
        # One script (lua/record.lua): the record, the claim let go, the status counters,
        # the final state (the one full copy of the answer), the stream's entry (the index
        # only) and the running checkpoint dropped, all or nothing, in one round trip.
        stored = int(self._record(
            keys=[self.keys.job(job_id, "claims"), self.keys.job(job_id, "records"),
                  self.keys.claims_of(worker), self.keys.job(job_id, "counts"),
                  self.keys.job(job_id, "events"), self.keys.job(job_id, "final"),
                  self.keys.job(job_id, "ckpt", index), self.keys.job(job_id, "tools", index),
                  self.keys.job(job_id, "sent"), self.keys.job(job_id, "starts")],
            args=[str(index), token, raw, job_id, self.ttl_s, result.status,
                  pack_final(checkpoint) if checkpoint is not None else ""]))
        if stored < 0:
            raise ClaimLost(f"{job_id}/{index}: claim {token} was superseded")
        if not stored:
            return self.get(job_id, index) or result, None
        # Only the record Redis's fenced write stored goes to the results store (a refused
        # duplicate or stale one never does); its primary key keeps a retry's second write out.
        self.archive.keep([(result, pack_final(checkpoint) if checkpoint is not None else None)])
        return result, stored

    def get(self, job_id: str, index: int) -> SubagentResult | None:
        raw = self.r.hget(self.keys.job(job_id, "records"), str(index))
        if raw is None and self.archive.gone(job_id):
            return self.archive.store.records_page(job_id, index, index + 1)[0]  # type: ignore[union-attr]
        return SubagentResult.model_validate_json(raw) if raw else None

    def all(self, job_id: str) -> dict[int, SubagentResult]:
        """Every record at once: for small jobs and tests; large ones use ``walk``."""
        raw = self.r.hgetall(self.keys.job(job_id, "records"))
        if not raw and self.archive.gone(job_id):
            return {r.index: r for r in self.archive.store.iter_records(job_id)}  # type: ignore[union-attr]
        return {int(k): SubagentResult.model_validate_json(v) for k, v in raw.items()}

    def page(self, job_id: str, start: int, stop: int) -> list[SubagentResult | None]:
        """The records of sub-agents ``start`` to ``stop - 1`` (None where there is none yet)."""
        if stop <= start:
            return []
        raws = self.r.hmget(self.keys.job(job_id, "records"), [str(i) for i in range(start, stop)])
        if not any(raws) and self.archive.gone(job_id):
            return self.archive.store.records_page(job_id, start, stop)  # type: ignore[union-attr]
        return [SubagentResult.model_validate_json(raw) if raw else None for raw in raws]

    def walk(self, job_id: str, n: int, page: int = PAGE
                     ) -> Iterator[tuple[int, SubagentResult | None]]:
        """(index, record or None) for sub-agents 0 to ``n - 1``, read ``page`` at a time."""
        for start in range(0, n, page):
            stop = min(n, start + page)
            yield from zip(range(start, stop), self.page(job_id, start, stop),
                           strict=True)

    def status_counts(self, job_id: str, n: int) -> dict[str, int]:
        """Records per status, from the counters ``put`` keeps (one read)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hgetall(self.keys.job(job_id, "counts"))
        pipe.hlen(self.keys.job(job_id, "records"))
        raw, stored = pipe.execute()
        if not stored and self.archive.gone(job_id):
            return self.archive.store.status_counts(job_id)  # type: ignore[union-attr]
        if stored and not raw:  # records written before the counters existed
            return status_counts([r for _, r in self.walk(job_id, n) if r is not None])
        counts: dict[str, int] = dict.fromkeys(STATUSES, 0)
        counts.update({_s(k): int(v) for k, v in raw.items()})
        return counts

    def count(self, job_id: str) -> int:
        n = int(self.r.hlen(self.keys.job(job_id, "records")))
        if not n and self.archive.gone(job_id):
            return self.archive.store.record_count(job_id)  # type: ignore[union-attr]
        return n

    def report(self, job_id: str, index: int) -> SubagentReport | None:
        """The sub-agent's report, read from its final state (None before it finished)."""
        raw = self.r.hget(self.keys.job(job_id, "final"), str(index))
        if raw:
            return unpack_final(raw).report()
        if self.archive.gone(job_id):
            state = self.archive.final_state(job_id, index)
            return state.report() if state is not None else None
        raw = self.r.get(self.keys.job(job_id, "report", index))  # written before 'final' existed
        return SubagentReport.model_validate_json(raw) if raw else None
