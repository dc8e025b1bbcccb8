"""What a worker logs: one key=value line per LLM call outcome, no secrets, no prompt text.

The per-call lines come from ``drover.workers.agent.llm`` (its logger has the module's name)::

    llm call outcome=ok scope=llm:default:claude-sonnet-4-6 status=200 job=... sub=3
        wait_s=0.412 call_s=1.020 in=1840 out=212 cache_read=1500 est_in=1795
        reserved_in=1795 reserved_out=240
    llm call outcome=n529 scope=... status=529 type=overloaded_error job=... sub=7
        wait_s=0.000 call_s=0.210 in=0 out=0 next=retry countdown=1.7

``in``/``out`` are what the provider counted; ``est_in`` is the input estimate and
``reserved_in``/``reserved_out`` what the limiter held for the call (more than the estimate
until the scope's answers calibrate it). ``outcome`` is ``ok``, a failure kind (``n429``,
``n529``, ``n5xx``, ``n4xx``, ``nconn``, as the retry policy names them) or
``cancelled``. ``configure_logging`` (run when the Celery app is built) turns down what would
add noise or leak content, at every level, DEBUG too:

- The SDK (logger ``anthropic``) logs each request's options, body included (the prompt), at
  DEBUG; httpx (``httpx``, and ``httpx2``, the fork this SDK version ships) and httpcore log
  every request at INFO and headers at DEBUG. Our line says what matters, so they are held
  at WARNING unless ``DROVER_LOG_HTTP_BODIES=true`` asks for the bodies (a debugging aid for
  a test key, never for production; the SDK's own ``ANTHROPIC_LOG`` alone does not).
- Celery's "Task ... succeeded in 0.3s: <return value>" line prints the task's result, which
  holds the sub-agent's summary (model text, often quoting the prompt). The value is dropped;
  the task name, id and run time stay.
- A refused API key (401 ``authentication_error``) is the same cause for every sub-agent of
  a job: the first failed call's line says so and what to check, later ones of the same job
  are not logged (each sub-agent still ends with a ``failed`` record).
- An ack the broker did not take (its connection lost, or silent past
  ``DROVER_SOCKET_TIMEOUT_S``) is logged by kombu as CRITICAL with a chained traceback per
  task. It is an expected failure with a known end: the message stays unacked, the broker
  hands it out again (Redis: after its visibility timeout; RabbitMQ: when the connection is
  gone), and that copy stops at the sub-agent's claim or finished record. One WARNING line
  says so, without the traceback.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

from celery.app import trace

__all__ = ["QUIET", "AckNotTaken", "OncePerJob", "configure_logging"]

# Loggers whose lines repeat ours or carry request bodies and headers.
QUIET = ("anthropic", "httpx", "httpx2", "httpcore")
SUCCESS_LINE = "Task %(name)s[%(id)s] succeeded in %(runtime)ss"


class AckNotTaken(logging.Filter):
    """Turn kombu's "Couldn't ack" CRITICAL-with-traceback into one WARNING line that says
    what follows (the module docstring says why)."""

    PREFIX = "Couldn't ack"

    def filter(self, record: logging.LogRecord) -> bool:
        if not (isinstance(record.msg, str) and record.msg.startswith(self.PREFIX)):
            return True
        error = record.exc_info[1] if record.exc_info else None
        record.msg = ("the broker did not take the ack of task message %r (%s: %s): it hands "
                      "the message out again, and that copy stops at the sub-agent's claim or "
                      "record")
        first = record.args[:1] if isinstance(record.args, tuple) else ()
        record.args = (*first, type(error).__name__, error)
        record.exc_info = record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


class OncePerJob(logging.Filter):
    """Let the first ``authentication_error`` call line of each job through, drop the rest."""

    KIND = "authentication_error"
    REMEMBERED_JOBS = 4096

    def __init__(self) -> None:
        super().__init__()
        self._seen: OrderedDict[str, None] = OrderedDict()

    def filter(self, record: logging.LogRecord) -> bool:
        args: Any = record.args
        # The failed-call line's arguments: outcome, scope, status, type, job, ...
        if not (isinstance(args, tuple) and len(args) > 4 and args[3] == self.KIND):
            return True
        job = str(args[4])
        if job in self._seen:
            return False
        self._seen[job] = None
        while len(self._seen) > self.REMEMBERED_JOBS:
            self._seen.popitem(last=False)
        record.msg = (f"{record.msg} (the API refused the key: every sub-agent of this job "
                      "fails the same way; check ANTHROPIC_API_KEY and "
                      "DROVER_ANTHROPIC_BASE_URL. Not logged again for this job)")
        return True


_once_per_job = OncePerJob()
_ack_not_taken = AckNotTaken()


def configure_logging(settings: Any = None) -> None:
    """Our levels and filters; again after the provider SDKs are imported (``tasks.py``), since
    each SDK applies its own ``ANTHROPIC_LOG``/``OPENAI_LOG`` when imported. Importing them
    here would cost a submitting process, which builds the app, seconds of imports."""
    bodies = bool(getattr(settings, "log_http_bodies", False))
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.NOTSET if bodies else logging.WARNING)
    llm = logging.getLogger("drover.workers.agent.llm")
    if _once_per_job not in llm.filters:
        llm.addFilter(_once_per_job)
    request = logging.getLogger("celery.worker.request")  # where Celery acks a task
    if _ack_not_taken not in request.filters:
        request.addFilter(_ack_not_taken)
    # Celery reads this module global when it logs a success.
    trace.LOG_SUCCESS = SUCCESS_LINE
