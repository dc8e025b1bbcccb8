"""The Celery task layer: the app (``app``; ``celery -A drover.workers.app`` finds it through
``workers/app.py``), the tasks a job is made of (``tasks``: a sub-agent, the join, the plan,
sending a part again), publishing them (``dispatch``), a worker process's life around them
(``lifecycle``: start, receipts, shutdown), its node name (``nodenames``) and what it says once
ready (``startup``).

Inside: a delivery's claim on its part (``_delivery``), a job's place in the fair-share window
as the tasks see it (``_window``), the consumer's pulse (``_progress``) and what a worker logs
(``_logs``). The only room that imports Celery; it sits above every other room of
``workers/`` (docs/architecture.md). The modules are imported by name, not from here:
importing ``app`` builds the Celery app from the settings.
"""

__all__ = ["app", "dispatch", "lifecycle", "nodenames", "startup", "tasks"]
