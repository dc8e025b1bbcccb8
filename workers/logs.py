"""What a worker logs: one key=value line per LLM call outcome, no secrets, no prompt text.

The per-call lines come from ``workers.agent.llm`` (logger ``drover.llm``)::

    llm call outcome=ok scope=llm:default:claude-sonnet-4-6 status=200 job=... sub=3
        wait_s=0.412 call_s=1.020 in=1840 out=212 cache_read=1500
    llm call outcome=n529 scope=... status=529 type=overloaded_error job=... sub=7
        wait_s=0.000 call_s=0.210 in=0 out=0 next=retry countdown=1.7

``outcome`` is ``ok``, a failure kind (``n429``, ``n529``, ``n5xx``, ``n4xx``, ``nconn``, the
names of the limiter's counters) or ``cancelled``. Two other sources would add noise or leak
content, so ``configure_logging`` (run when the Celery app is built) turns them down:

- httpx logs every request at INFO; our line says the same and more.
- Celery's "Task ... succeeded in 0.3s: <return value>" line prints the task's result, which
  holds the sub-agent's summary (model text, often quoting the prompt). The value is dropped;
  the task name, id and run time stay.
"""

from __future__ import annotations

import logging

from celery.app import trace

# Loggers whose INFO lines repeat ours.
QUIET = ("httpx", "httpx2", "httpcore")  # this SDK version ships its own fork, httpx2
SUCCESS_LINE = "Task %(name)s[%(id)s] succeeded in %(runtime)ss"


def configure_logging() -> None:
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    # Celery reads this module global when it logs a success.
    trace.LOG_SUCCESS = SUCCESS_LINE
