"""Jobs as data: the spec, the records, the job store in Redis, and who holds what (claims
and liveness, which recovery, ``workers/recovery/``, acts on).

Knows no Celery and nothing of the agent.
Nothing outside the job store touches its Redis keys; ``keys.py`` spells them all.
``reply_text`` reads a reply of the job store's Redis client (which does not decode) as text,
for the scheduler and the sweep, which read through the same client.
"""

from drover.workers.jobs._decode import text as reply_text
from drover.workers.jobs.claims import TOKEN_HEADER, ClaimLost
from drover.workers.jobs.keys import JobKeys
from drover.workers.jobs.liveness import Heartbeat
from drover.workers.jobs.meta import ACTIVE
from drover.workers.jobs.records import Checkpoint, JobResult, SubagentReport, SubagentResult, Usage
from drover.workers.jobs.spec import JobSpec
from drover.workers.jobs.store import JobNotFound, JobStore

__all__ = ["ACTIVE", "TOKEN_HEADER", "Checkpoint", "ClaimLost", "Heartbeat", "JobKeys",
           "JobNotFound", "JobResult", "JobSpec", "JobStore", "SubagentReport", "SubagentResult",
           "Usage", "reply_text"]
