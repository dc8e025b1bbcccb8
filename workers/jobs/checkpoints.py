"""A running sub-agent's state: its checkpoint (its conversation so far), its tool results,
its send mark, and its start, which reads all it needs in one round trip and takes its claim.
Writes under a claim token are fenced (``claims.py``)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import redis

from drover.errors import JobNotFound
from drover.workers.jobs._decode import text as _s
from drover.workers.jobs._stored import execute_loaded, unpack_final
from drover.workers.jobs.cancels import Cancels
from drover.workers.jobs.claims import LUA, ClaimLost, Claims
from drover.workers.jobs.keys import JobKeys
from drover.workers.jobs.records import Checkpoint, SubagentResult
from drover.workers.jobs.spec import JobSpec

__all__ = ["Checkpoints", "SubagentStart"]


@dataclass
class SubagentStart:
    """A sub-agent's starting point: its record if it already finished, else what it needs."""

    record: SubagentResult | None = None
    spec: JobSpec | None = None
    checkpoint: Checkpoint | None = None
    task: str | None = None
    deadline_in: float | None = None  # seconds until the job's deadline, on Redis's clock
    token: int = 0  # the claim this delivery took (see claims.py); 0 when it took none
    stale: bool = False  # another delivery holds the claim: stop before any call
    sent: dict[str, Any] | None = None  # the last send's mark (before_send), if any


class Checkpoints:
    def __init__(self, client: redis.Redis, keys: JobKeys, ttl_s: int, *, claims: Claims,
                 cancels: Cancels) -> None:
        self.r = client
        self.keys = keys
        self.ttl_s = ttl_s
        self.claims = claims
        self.cancels = cancels
        self._send = client.register_script((LUA / "send.lua").read_text())

    def start(self, job_id: str, index: int, *, worker: str | None = None,
              token: int = 0) -> SubagentStart:
        """Everything a sub-agent needs to start or resume, in one round trip.

        With ``worker``, the same round trip takes the sub-agent's claim for that worker,
        if ``token`` (the message's) is the current one; else the start comes back ``stale``.
        """
        # One id for this start, however often it is sent: redis-py sends the pipeline again
        # when its reply is lost (a restart), and execute_loaded builds it again when Redis
        # lost the scripts (that restart): the start.lua that ran gives back its token.
        delivery = uuid.uuid4().hex

        def queued() -> redis.client.Pipeline:
            pipe = self.r.pipeline(transaction=False)
            if worker is not None:
                self.claims.start(job_id, index, token, worker, client=pipe, delivery=delivery)
            pipe.hget(self.keys.job(job_id, "records"), str(index))
            pipe.get(self.keys.job(job_id, "spec"))
            pipe.get(self.keys.job(job_id, "ckpt", index))
            pipe.lindex(self.keys.job(job_id, "tasks"), index)
            pipe.hget(self.keys.job(job_id, "meta"), "deadline")
            pipe.time()
            pipe.hget(self.keys.job(job_id, "sent"), str(index))
            return pipe

        replies = execute_loaded(queued)
        claimed = int(replies.pop(0)) if worker is not None else 0
        record, spec, checkpoint, task, deadline, (seconds, micros), sent = replies
        if record is not None:
            return SubagentStart(record=SubagentResult.model_validate_json(record))
        if claimed < 0:
            return SubagentStart(stale=True)
        if spec is None:
            raise JobNotFound(f"no job {job_id!r} in Redis (wrong id, or its records expired)")
        if checkpoint is None and task is None:
            raise JobNotFound(f"job {job_id!r} has no subtask {index}")
        return SubagentStart(
            spec=JobSpec.model_construct(**json.loads(spec)),  # validated at submit
            checkpoint=Checkpoint.model_validate_json(checkpoint) if checkpoint else None,
            task=_s(task) if task is not None else None,
            deadline_in=float(deadline) - (seconds + micros / 1e6) if deadline else None,
            token=claimed, sent=json.loads(sent) if sent else None)

    def before_send(self, job_id: str, index: int, token: int, mark: dict[str, Any]
                    ) -> str | None:
        """Right before a sub-agent's call goes out: ``ClaimLost`` when another delivery holds
        it, the reason when its job was cancelled (or its deadline passed: that cancels the
        job), else None once ``mark`` is stored as the sub-agent's last send (lua/send.lua)."""
        reply = self._send(keys=[self.keys.job(job_id, "claims"), self.keys.job(job_id, "meta"),
                                 self.keys.job(job_id, "sent")],
                           args=[str(index), token, json.dumps(mark), self.ttl_s])
        code = int(reply[0])
        if code < 0:
            raise ClaimLost(f"{job_id}/{index}: claim {token} was superseded")
        if code == 1:
            return None
        if len(reply) > 2:  # the deadline passed: the first to see it cancels the job
            self.cancels.cancel(job_id, "deadline")
            return _s(self.r.hget(self.keys.job(job_id, "meta"), "cancelled") or "deadline")
        return _s(reply[1])

    def load(self, job_id: str, index: int) -> Checkpoint | None:
        """The running checkpoint, or once the sub-agent finished its final state."""
        raw = self.r.get(self.keys.job(job_id, "ckpt", index))
        if raw is not None:
            return Checkpoint.model_validate_json(raw)
        raw = self.r.hget(self.keys.job(job_id, "final"), str(index))
        return unpack_final(raw) if raw else None

    def save(self, job_id: str, index: int, state: Checkpoint,
                        token: int = 0) -> None:
        """Store the checkpoint; with a claim ``token``, only while it is the claim."""
        if token:
            self.claims.set_fenced(job_id, index, token, self.keys.job(job_id, "ckpt", index),
                                   state.model_dump_json())
            return
        self.r.set(self.keys.job(job_id, "ckpt", index), state.model_dump_json(), ex=self.ttl_s)

    def tool_results(self, job_id: str, index: int) -> dict[str, dict[str, Any]]:
        raw = self.r.hgetall(self.keys.job(job_id, "tools", index))
        return {_s(k): json.loads(v) for k, v in raw.items()}

    def save_tool_result(self, job_id: str, index: int, tool_use_id: str,
                         result: dict[str, Any], token: int = 0) -> None:
        key = self.keys.job(job_id, "tools", index)
        if token:
            self.claims.hset_fenced(job_id, index, token, key, tool_use_id, json.dumps(result))
            return
        pipe = self.r.pipeline()
        pipe.hset(key, tool_use_id, json.dumps(result))
        pipe.expire(key, self.ttl_s)
        pipe.execute()
