"""Claims: which worker holds each part of a running job, with a fencing token.

A part is a sub-agent (its index), the job's join or its planning task. Its claim, one field
of the job's ``claims`` hash, reads ``token|state|worker``:

- ``sent``: a message carrying ``token`` is on the broker (or nothing was claimed yet: token 0,
  the chord's own messages);
- ``held``: a worker received that message and keeps it (prefetched, or waiting out a retry
  countdown in its memory);
- ``running``: a delivery started and took a new token; only writes that name that token
  (checkpoints, tool results, the record) are stored. The job's ``starts`` hash names the
  start that took it, so that start, sent again by the client after Redis ran it and its
  reply was lost (a restart), gets its token back instead of being told it is stale.

A message carries the token it was sent with (a task header). A delivery whose token is not
the claim's is stale (a second copy: the broker's own redelivery, a message the sweep sent
again, a worker that was only paused) and stops before any LLM or tool call; the record is
stored once. Each worker also lists the parts it holds or runs (``worker:{id}:claims``), so
the recovery sweep finds a dead worker's parts without reading the broker or every job.

Every change is one Lua script (``lua/*.lua``), so a claim never moves half-way. The record's
own write lets go of the claim too: the job store's ``lua/record.lua``, which stores the
record with its counters in the same step.

**Fencing across a Redis failover.** Replication is asynchronous: the last writes to a master
may be missing on the replica Sentinel (or a managed Redis) promotes. If one of them was a
start (token 5 taken by delivery A), the new master still says 4, and a second delivery B
(the broker's copy of a message whose pop did not replicate either, or the sweep) would take
5 again there while A still runs: both would pass every fence. So a token carries an
*epoch* (``lua/_epoch.lua``): ``EPOCH * 1000000 + n``, the epoch moving on whenever the
server minting a token is another master than the last one that did (its replication id,
``INFO replication``'s ``master_replid``, differs from the one in the fence hash; a promoted
replica always takes a new one). B's token is then of the new epoch, A's writes name a token
of the old one and are refused, and A stops (``ClaimLost``) before its next call. A's start
that did replicate keeps its token, so a failover alone stops nothing.

Why not ``WAIT`` after each start: it costs a round trip to the replicas on every delivery,
it cannot say what to do when it times out (the replica may be gone for good: a new master
has none until the old one returns), and it proves only that *some* replica has the write,
not the one that gets promoted. The epoch costs one ``INFO replication`` inside the script
and is exact for every promotion. Its limit: an epoch move that itself did not replicate
(a master promoted, minting, and lost again within one replication lag) could be made again
by the next master; Sentinel does not fail the same master over twice within its
``failover-timeout`` (3 minutes by default), which keeps that window shut in practice.
What else a failover loses (a checkpoint, a record, a queued message) is redone, not
fenced: see docs/high-availability.md.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from drover._signals import ClaimLost
from drover.workers.jobs._decode import text as _s
from drover.workers.jobs.keys import JobKeys

__all__ = ["ClaimLost", "Claims", "Held", "part_name"]

LUA = Path(__file__).with_name("lua")
TOKEN_HEADER = "drover_token"


def part_name(part: int | str) -> str:
    return str(part)


@dataclass(frozen=True)
class Held:
    """One entry of a worker's list: a part of a job it held or ran, with the token then."""

    job_id: str
    part: str
    token: int


class Claims:
    """The claim scripts over one Redis client and key prefix (the job store owns one)."""

    def __init__(self, client: redis.Redis, prefix: str, ttl_s: int):
        self.r = client
        self.prefix = prefix
        self.keys = JobKeys(prefix)
        self.ttl_s = ttl_s
        self._receive = client.register_script((LUA / "receive.lua").read_text())
        epoch = (LUA / "_epoch.lua").read_text()
        self._start = client.register_script(epoch + (LUA / "start.lua").read_text())
        self._fenced = client.register_script((LUA / "fenced.lua").read_text())
        self._release = client.register_script((LUA / "release.lua").read_text())
        self._takeover = client.register_script(epoch + (LUA / "takeover.lua").read_text())

    # --- keys ---------------------------------------------------------------------------
    def job_key(self, job_id: str, name: str) -> str:
        return self.keys.job(job_id, name)

    def worker_key(self, worker: str) -> str:
        return self.keys.claims_of(worker)

    def fence_key(self) -> str:
        return self.keys.fence

    def _keys(self, job_id: str, worker: str) -> list[str]:
        return [self.job_key(job_id, "claims"), self.worker_key(worker),
                self.job_key(job_id, "records")]

    # --- the life of a part -------------------------------------------------------------
    def receive(self, job_id: str, part: int | str, token: int, worker: str) -> int:
        """The worker took the part's message: 1 holds it, 0 finished, -1 stale."""
        return int(self._receive(keys=self._keys(job_id, worker),
                                 args=[part_name(part), token, worker, job_id, self.ttl_s]))

    def start(self, job_id: str, part: int | str, token: int, worker: str,
              client: redis.client.Pipeline | None = None, delivery: str | None = None
              ) -> Any:
        """Take the claim to run the part (new token > 0; 0 finished; -1 stale).

        With ``client`` a pipeline, the call is queued there (its reply comes with the rest,
        and this returns the pipeline). ``delivery`` names this start (default: a new id):
        the same start sent again after its reply was lost (the client's retry through a
        Redis restart) gets the token it took, where any other delivery is stale. A caller
        that may build the call again for one start passes the same id each time."""
        return self._start(keys=[*self._keys(job_id, worker), self.fence_key(),
                                 self.job_key(job_id, "starts")],
                           args=[part_name(part), token, worker, job_id, self.ttl_s,
                                 delivery or uuid.uuid4().hex],
                           client=client)

    def set_fenced(self, job_id: str, part: int | str, token: int, key: str, value: str) -> None:
        if not self._fenced(keys=[self.job_key(job_id, "claims"), key],
                            args=[part_name(part), token, "set", self.ttl_s, value]):
            raise ClaimLost(f"{job_id}/{part}: claim {token} was superseded")

    def hset_fenced(self, job_id: str, part: int | str, token: int, key: str, field: str,
                    value: str) -> None:
        if not self._fenced(keys=[self.job_key(job_id, "claims"), key],
                            args=[part_name(part), token, "hset", self.ttl_s, field, value]):
            raise ClaimLost(f"{job_id}/{part}: claim {token} was superseded")

    def release(self, job_id: str, part: int | str, token: int, worker: str) -> bool:
        """The part's message went back to the broker with ``token``: the claim says so."""
        return bool(self._release(keys=self._keys(job_id, worker)[:2],
                                  args=[part_name(part), token, worker, job_id]))

    def takeover(self, job_id: str, part: int | str, expected: int, worker: str) -> int:
        """Take the part from dead ``worker`` (or, ``expected`` -1, a lost message): new token."""
        return int(self._takeover(keys=[*self._keys(job_id, worker), self.fence_key()],
                                  args=[part_name(part), expected, worker, job_id, self.ttl_s]))

    def drop(self, job_id: str, part: int | str, worker: str) -> None:
        """A job-level part (join, plan) is done: nobody needs to recover it."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hdel(self.job_key(job_id, "claims"), part_name(part))
        pipe.hdel(self.job_key(job_id, "starts"), part_name(part))
        pipe.hdel(self.worker_key(worker), f"{job_id}|{part_name(part)}")
        pipe.execute()

    def owned(self, job_id: str, part: int | str, token: int) -> bool:
        return token_of(self.r.hget(self.job_key(job_id, "claims"), part_name(part))) == token

    # --- what the sweep reads -----------------------------------------------------------
    def held_by(self, worker: str) -> list[Held]:
        out = []
        for field, token in self.r.hgetall(self.worker_key(worker)).items():
            job_id, _, part = _s(field).rpartition("|")
            out.append(Held(job_id, part, int(token)))
        return out

    def claim(self, job_id: str, part: int | str) -> str | None:
        raw = self.r.hget(self.job_key(job_id, "claims"), part_name(part))
        return None if raw is None else _s(raw)

    def restore(self, job_id: str, part: int | str, raw: str | None, worker: str,
                token: int) -> None:
        """Undo a takeover whose message could not be sent (the next sweep tries again)."""
        pipe = self.r.pipeline()
        if raw is None:
            pipe.hdel(self.job_key(job_id, "claims"), part_name(part))
        else:
            pipe.hset(self.job_key(job_id, "claims"), part_name(part), raw)
        pipe.hset(self.worker_key(worker), f"{job_id}|{part_name(part)}", token)
        pipe.execute()


def token_of(raw: bytes | str | None) -> int:
    if raw is None:
        return 0
    return int(_s(raw).split("|", 1)[0])
