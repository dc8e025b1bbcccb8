"""Every Redis key of the job store and of what hangs off it: claims, liveness, the batch
queue and recovery's bookkeeping. The one place that spells them; everything else asks
``JobKeys``. (The limiter's, the fair-share window's and telemetry's keys are their rooms'
own, each under ``{prefix}:`` too.)

    {p}:job:{id}:{part}      a job: spec, tasks, meta, records, events (record indexes),
                             final (each finished sub-agent's last state: the one full copy
                             of its answer), claims, ckpt:{i} (while it runs), journal:{i}
                             (the answered calls of a sub-agent's limited client), starts
                             (which delivery took each running claim), ...
    {p}:jobs                 every job by creation time (drover jobs, the stalled scan)
    {p}:cancel               the cancel channel (pub/sub)
    {p}:fence                the fencing-token counter and its epoch
    {p}:unanswered:{scope}   calls sent whose answer never came (per limiter scope)
    {p}:workers              the worker registry; {p}:worker:{w} a heartbeat,
                             {p}:worker:{w}:claims the parts it holds,
                             {p}:worker:{w}:stuck why it stopped beating though it runs
    {p}:batch:...            the Message Batches queue
    {p}:recovering, {p}:stalled, {p}:recovery:{lock|death|scan|repairs|archive}   the sweep's
    {p}:results:pending      jobs whose end the results store missed (copied when it answers)
    {p}:tenant:{t}:usd:{month}   a tenant's dollars reserved and spent in a month (its cap)
"""

from __future__ import annotations

__all__ = ["JobKeys"]


class JobKeys:
    """The key names under one ``DROVER_KEY_PREFIX``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def job(self, job_id: str, *parts: object) -> str:
        return ":".join([self.prefix, "job", job_id, *map(str, parts)])

    def journal(self, job_id: str, index: int) -> str:
        """A sub-agent's journal of answered calls (``journal.Journal``)."""
        return self.job(job_id, "journal", index)

    @property
    def jobs(self) -> str:
        return f"{self.prefix}:jobs"

    @property
    def cancel_channel(self) -> str:
        return f"{self.prefix}:cancel"

    @property
    def fence(self) -> str:
        return f"{self.prefix}:fence"

    def unanswered(self, scope: str = "*") -> str:
        return f"{self.prefix}:unanswered:{scope}"

    @property
    def workers(self) -> str:
        return f"{self.prefix}:workers"

    def heartbeat(self, worker: str) -> str:
        return f"{self.prefix}:worker:{worker}"

    def claims_of(self, worker: str) -> str:
        return f"{self.prefix}:worker:{worker}:claims"

    def stuck(self, worker: str) -> str:
        return f"{self.prefix}:worker:{worker}:stuck"

    @property
    def batch(self) -> str:
        return f"{self.prefix}:batch"

    @property
    def recovering(self) -> str:
        return f"{self.prefix}:recovering"

    @property
    def stalled(self) -> str:
        return f"{self.prefix}:stalled"

    @property
    def results_pending(self) -> str:
        return f"{self.prefix}:results:pending"

    def tenant_usd(self, tenant: str, month: str) -> str:
        """A tenant's dollars of one calendar month (``YYYY-MM``, UTC)."""
        return f"{self.prefix}:tenant:{tenant}:usd:{month}"

    def recovery(self, name: str) -> str:
        return f"{self.prefix}:recovery:{name}"
