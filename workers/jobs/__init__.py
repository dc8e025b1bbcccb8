"""Jobs as data: the spec, the records, the job store in Redis, and recovery of lost tasks.

Knows no Celery (recovery is handed a function that sends a task) and nothing of the agent.
Nothing outside the job store touches its Redis keys.
"""

from workers.jobs.connections import async_redis, sync_redis
from workers.jobs.records import Checkpoint, JobResult, SubagentReport, SubagentResult, Usage
from workers.jobs.recovery import start_sweeper, sweep
from workers.jobs.spec import JobSpec
from workers.jobs.store import ACTIVE, JobNotFound, JobStore

__all__ = ["ACTIVE", "Checkpoint", "JobNotFound", "JobResult", "JobSpec", "JobStore",
           "SubagentReport", "SubagentResult", "Usage", "async_redis", "start_sweeper", "sweep",
           "sync_redis"]
