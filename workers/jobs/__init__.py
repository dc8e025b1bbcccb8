"""Jobs as data: the spec, the records, the job store in Redis, and who holds what (claims
and liveness, which recovery, ``workers/recovery/``, acts on).

Knows no Celery and nothing of the agent.
Nothing outside the job store touches its Redis keys; ``keys.py`` spells them all.
The job store is parts, each a module named after what it holds (``specs``, ``meta``,
``record_store``, ``outcomes``, ``stream``, ``checkpoints``, ``cancels``, ``spending``,
``counters``, ``claims``, with ``archive`` the results store behind them); ``JobStore`` builds
them once over one Redis client and only groups them.
``reply_text`` reads a reply of the job store's Redis client (which does not decode) as text,
for the scheduler and the sweep, which read through the same client.
"""

from drover.workers.jobs._decode import text as reply_text
from drover.workers.jobs.archive import Archive
from drover.workers.jobs.cancels import Cancels
from drover.workers.jobs.checkpoints import Checkpoints, SubagentStart
from drover.workers.jobs.claims import TOKEN_HEADER, ClaimLost, Claims
from drover.workers.jobs.counters import Counters
from drover.workers.jobs.journal import Journal, Kept
from drover.workers.jobs.keys import JobKeys
from drover.workers.jobs.liveness import Heartbeat
from drover.workers.jobs.meta import ACTIVE, JobMeta
from drover.workers.jobs.outcomes import Outcomes
from drover.workers.jobs.record_store import Records
from drover.workers.jobs.records import Checkpoint, JobResult, SubagentReport, SubagentResult, Usage
from drover.workers.jobs.spec import JobSpec
from drover.workers.jobs.specs import Specs
from drover.workers.jobs.spending import Spending
from drover.workers.jobs.store import JobNotFound, JobStore
from drover.workers.jobs.stream import Stream

__all__ = ["ACTIVE", "TOKEN_HEADER", "Archive", "Cancels", "Checkpoint", "Checkpoints", "ClaimLost",
           "Claims", "Counters", "Heartbeat", "JobKeys", "JobMeta", "JobNotFound", "JobResult",
           "Journal", "Kept",
           "JobSpec", "JobStore", "Outcomes", "Records", "Specs", "Spending", "Stream",
           "SubagentReport", "SubagentResult", "SubagentStart", "Usage", "reply_text"]
