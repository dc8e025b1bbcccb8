"""The Celery app: ``celery -A drover.workers.app worker`` (or ``drover worker``).

A worker that cannot work refuses to start, with one message that says what to fix, instead
of starting and failing every sub-agent later (``check_worker`` of
``drover.workers.connections.preflight``, run by ``drover worker`` and, through Celery's
``celeryd_init`` signal, by ``celery -A drover.workers.app worker``):

- no API key, and no ``DROVER_ANTHROPIC_BASE_URL`` (a proxy may need none: then the worker
  starts, says so once, and sends no key; a 401 fails each sub-agent as
  ``authentication_error``; drover's simulator, like the API, needs a key and takes any);
- a module in ``DROVER_TOOL_MODULES`` that does not import;
- Redis, the broker or the result backend not answering (one short attempt).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import celeryd_init

from drover.config import SettingsError, get_settings
from drover.config.celery import celery_config
from drover.workers.connections.preflight import WorkerCannotStart, check_worker
from drover.workers.services import Services, services
from drover.workers.tasklayer._chord_count import count_patiently
from drover.workers.tasklayer._logs import configure_logging
from drover.workers.tasklayer._progress import ConsumerPulse

__all__ = ["DroverCelery", "app"]


class DroverCelery(Celery):
    """Celery, with TCP keepalive timings on the Redis result backend's connections too, and
    a chord member's count that waits out a Redis that is away (``_chord_count.py``).

    Celery's Redis backend takes ``redis_socket_keepalive`` but no timings, so its sockets
    kept others than DROVER_KEEPALIVE_S (read back from the kernel: 30 s idle, a probe every
    5 s; tests/unit/test_silent_clients.py). The backend makes its connection pool on first
    use, after this has added the timings (from ``result_backend_transport_options``, where
    ``config/celery.py`` puts them)."""

    def _get_backend(self) -> Any:
        backend = super()._get_backend()
        params = getattr(backend, "connparams", None)
        timings = (self.conf.result_backend_transport_options or {}).get(
            "socket_keepalive_options")
        if isinstance(params, dict) and params.get("socket_keepalive") and timings:
            params.setdefault("socket_keepalive_options", dict(timings))
        count_patiently(backend)
        return backend

    @property
    def drover(self) -> Services:
        """The worker process's root: its shared parts (Redis, the job store, the limiter,
        the schedulers, the heartbeat), asked for the way Celery's own services are
        (``app.drover``, ``task.app.drover``, a bootstep's ``consumer.app.drover``). Built
        once per process and settings on first use, again in a forked prefork child (it
        must not share its parent's sockets) and after the settings change (tests:
        ``get_settings.cache_clear()``)."""
        return services(get_settings())


def _run_by_celerys_command_line() -> bool:
    """``celery -A drover.workers.app ...`` (the script, or ``python -m celery``)."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    return argv0.name == "celery" or argv0.parent.name == "celery"


try:
    _settings = get_settings()
except SettingsError as error:
    if not _run_by_celerys_command_line():
        raise
    # Celery's command line would print the import's traceback; the message says it all.
    print(error, file=sys.stderr, flush=True)
    raise SystemExit(2) from None

app = DroverCelery("drover", include=["drover.workers.tasklayer.tasks",
                                      "drover.workers.tasklayer.lifecycle"])
app.config_from_object(celery_config(_settings))
# Liveness means progress: the consumer pulses the heartbeat while it moves (_progress.py).
app.steps["consumer"].add(ConsumerPulse)
configure_logging(_settings)  # one line per LLM call; no prompt text, no task results


@celeryd_init.connect
def _refuse_to_start(**_: Any) -> None:
    if os.environ.get("_DROVER_WORKER_CHECKED") == "1":  # `drover worker` checked already
        return
    try:
        check_worker(get_settings())
    except WorkerCannotStart as error:
        print(f"drover worker: {error}", file=sys.stderr, flush=True)
        raise SystemExit(error.exit_code) from None
