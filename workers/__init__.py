"""What runs on a worker, in rooms; each room's ``__init__`` says what it holds and builds on.

- ``app.py``: the Celery app's public path (``celery -A drover.workers.app worker``).
- ``services.py``: the composition root: what one process shares, built once from its settings.
- ``tasklayer/``: the Celery task layer (the app, the tasks, publishing, a worker's life).
- ``agent/``: one sub-agent's loop, the LLM call, retries, planning, the join.
- ``providers/``: the LLM APIs behind one interface; the only room that imports a provider SDK.
- ``tools/``: the tools sub-agents call (the registry, ``@tool``, a turn's run, the demo's tools).
- ``limiter/``: the global rate limiter in Redis.
- ``fairshare/``: which sub-agents are published next (the window, the pump, tenants' budgets).
- ``jobs/``: jobs as data: the spec, the records, the job store, claims and liveness.
- ``recovery/``: the sweep that sends again what dead workers held.
- ``telemetry/``: Prometheus metrics and OpenTelemetry traces.
- ``connections/``: the Redis clients, the broker's Sentinel transport, first contact.

Nothing here imports the ``drover`` package above or the orchestrator
(``tests/unit/test_architecture.py`` checks it).
"""

__all__ = ["agent", "app", "connections", "fairshare", "jobs", "limiter", "providers",
           "recovery", "services", "tasklayer", "telemetry", "tools"]
