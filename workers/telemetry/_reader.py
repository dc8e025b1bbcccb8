"""What the processes' recorders wrote, read back for the exporter (``drover metrics``): the
one place besides ``_recorder`` that knows telemetry's Redis keys and field encoding."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple, cast

import redis

from drover.workers.telemetry._recorder import keys, parse_field, parse_job

__all__ = ["ActiveJob", "TelemetryReader"]


class ActiveJob(NamedTuple):
    job_id: str
    tenant: str
    entry: str  # as registered (``register_job``), to forget it by


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class TelemetryReader:
    """The fleet's counters, live processes and active jobs, as the recorders left them."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.r = client
        self.keys = keys(prefix)

    def counters(self) -> Iterator[tuple[str, tuple[str, ...], str | None, float]]:
        """(metric name, label values, histogram part or None, value) of every series; a
        field no version of ours wrote is skipped."""
        for key, value in self.r.hgetall(self.keys["counters"]).items():
            try:
                name, labels, part = parse_field(_s(key))
            except (ValueError, TypeError):
                continue
            yield name, labels, part, float(value)

    def processes(self) -> list[dict[str, str]]:
        """The live processes' heartbeats (pid, node, ``running:<job>`` counts); an expired
        one leaves the registry here."""
        ids = sorted(_s(x) for x in self.r.smembers(self.keys["procs"]))
        pipe = self.r.pipeline(transaction=False)
        for proc in ids:
            pipe.hgetall(self.keys["proc"] + proc)
        alive, gone = [], []
        for proc, beat in zip(ids, pipe.execute() if ids else [], strict=True):
            if beat:
                alive.append({_s(k): _s(v) for k, v in beat.items()})
            else:
                gone.append(proc)
        if gone:
            self.r.srem(self.keys["procs"], *gone)
        return alive

    def jobs(self) -> list[ActiveJob]:
        """The jobs counted as active, newest first."""
        # Members only (redis-py types the reply with WITHSCORES' pairs too).
        members = cast(list[bytes | str], self.r.zrevrange(self.keys["jobs"], 0, -1))
        return [ActiveJob(*parse_job(_s(m)), _s(m)) for m in members]

    def forget_jobs(self, jobs: Iterable[ActiveJob]) -> None:
        """Stop counting these as active: they ended."""
        entries = [job.entry for job in jobs]
        if entries:
            self.r.zrem(self.keys["jobs"], *entries)
