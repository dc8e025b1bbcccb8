"""A job's event stream: one entry per stored record (its index and status), which
``JobHandle`` follows for live results and ``drover metrics`` for status counts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import redis

from drover.workers.jobs._decode import entries as _entries
from drover.workers.jobs._decode import text as _s
from drover.workers.jobs._stored import field
from drover.workers.jobs.keys import JobKeys
from drover.workers.jobs.records import SubagentResult

__all__ = ["Stream"]


class Stream:
    def __init__(self, client: redis.Redis, keys: JobKeys) -> None:
        self.r = client
        self.keys = keys

    def events(self, job_id: str, after: str = "0-0", block_ms: int | None = None,
               count: int = 500) -> Iterator[tuple[str, SubagentResult]]:
        """Records from the job's stream after the entry id ``after``, oldest first."""
        reply = self.r.xread({self.keys.job(job_id, "events"): after}, count=count,
                             block=block_ms)
        for _stream, entries in _entries(reply):
            # An entry names the record (its index); the record itself is read from the
            # records hash, a page of entries in one round trip.
            parts = [_s(field(fields, "i") or "") for _id, fields in entries]
            wanted = [p for p in parts if p]
            found = dict(zip(wanted, self.r.hmget(self.keys.job(job_id, "records"), wanted),
                             strict=True)) if wanted else {}
            for (entry_id, fields), part in zip(entries, parts, strict=True):
                raw = found.get(part) if part else field(fields, "record")
                if raw:
                    yield _s(entry_id), SubagentResult.model_validate_json(raw)

    def new_statuses(self, after: dict[str, str], count: int = 500
                     ) -> dict[str, list[tuple[str, str]]]:
        """(entry id, status) of the records each job's stream gained after the entry id
        given for it, for many jobs in one call (at most ``count`` per job)."""
        if not after:
            return {}
        streams: dict[Any, Any] = {self.keys.job(job_id, "events"): last
                                   for job_id, last in after.items()}
        jobs = {key: job_id for key, job_id in zip(streams, after, strict=True)}
        found: dict[str, list[tuple[str, str]]] = {}
        for stream, entries in _entries(self.r.xread(streams, count=count)):
            rows = found.setdefault(jobs[_s(stream)], [])
            for entry_id, fields in entries:
                status = field(fields, "s")
                if status is not None:
                    rows.append((_s(entry_id), _s(status)))
                    continue
                try:  # an entry written before entries named their record
                    rows.append((_s(entry_id), json.loads(field(fields, "record"))["status"]))
                except (TypeError, ValueError, KeyError):
                    rows.append((_s(entry_id), ""))
        return found
