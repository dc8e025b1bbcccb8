"""First contact: does this process have what it needs, before it starts working?

``check_services`` is what every CLI command that needs Redis (or the broker) runs first: one
attempt with a short connect timeout (``FIRST_CONTACT_TIMEOUT_S``); when nothing answers, an
``Unreachable`` whose message names the variable, the URL it tried (password masked), what
went wrong and what to do. Without it a command would sit in the clients' reconnect loop
(about a minute, meant for a Redis that restarts under a running job) and end in a traceback.

``check_worker`` adds what a worker needs besides (see ``drover.workers.app``).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import traceback
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from drover.config import Settings
from drover.config.settings import mask_url

__all__ = ["FIRST_CONTACT_TIMEOUT_S", "Unreachable", "WorkerCannotStart", "broker_problem",
           "check_services", "check_worker", "has_credentials",
           "tool_module_problem", "redis_answers",
           "redis_problem"]

# One attempt, this long, for the first contact: long enough for a Redis across a WAN, short
# enough that a typo in a URL is reported at once.
FIRST_CONTACT_TIMEOUT_S = 3.0


class Unreachable(RuntimeError):
    """A service drover needs did not answer; the message says what to do."""


def redis_problem(url: str, timeout: float = FIRST_CONTACT_TIMEOUT_S) -> str | None:
    """None when a Redis answers PING at ``url`` within ``timeout``; else what went wrong."""
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout,
                                      retry=Retry(NoBackoff(), 0))
        with contextlib.closing(client):
            client.ping()
            return None
    except redis.AuthenticationError as error:
        return f"it refused the credentials in the URL ({error})"
    except redis.ResponseError as error:  # e.g. NOAUTH, or a server that is not Redis
        return f"it answered with an error ({error})"
    except redis.TimeoutError:
        return f"no answer within {timeout:g} s"
    except (redis.RedisError, OSError, ValueError) as error:
        return str(error).rstrip(".") or type(error).__name__


def redis_answers(url: str, timeout: float = 0.5) -> bool:
    return redis_problem(url, timeout) is None


def broker_problem(url: str, timeout: float = FIRST_CONTACT_TIMEOUT_S) -> str | None:
    """Like ``redis_problem`` for a Celery broker URL (Redis, or AMQP through kombu)."""
    if urlsplit(url).scheme in ("redis", "rediss", "unix"):
        return redis_problem(url, timeout)
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=timeout) as connection:
            connection.ensure_connection(max_retries=1, interval_start=0, timeout=timeout)
        return None
    except Exception as error:  # kombu raises the transport's own errors
        return str(error).rstrip(".") or type(error).__name__


def _unreachable(what: str, variable: str, url: str, problem: str) -> Unreachable:
    return Unreachable(
        f"cannot reach {what} at {mask_url(url)} ({variable}): {problem} (one attempt, "
        f"connect timeout {FIRST_CONTACT_TIMEOUT_S:g} s).\n"
        f"Start {what} there, or set {variable} to the URL of one that runs"
        + (" (`drover demo` starts a Redis of its own)." if what == "Redis" else "."))


def check_services(settings: Settings, *, broker: bool = True) -> None:
    """Raise Unreachable unless Redis (and, with ``broker``, the broker) answers now."""
    checked: set[str] = set()
    targets = [("Redis", "DROVER_REDIS_URL", settings.redis_url, redis_problem)]
    if broker:
        targets.append(("the broker", "DROVER_BROKER_URL" if settings.broker_url else
                        "DROVER_REDIS_URL", settings.broker, broker_problem))
        targets.append(("the result backend", "DROVER_RESULT_BACKEND" if
                        settings.result_backend else "DROVER_REDIS_URL", settings.backend,
                        broker_problem))
    for what, variable, url, probe in targets:
        if url in checked:
            continue
        checked.add(url)
        problem = probe(url)
        if problem is not None:
            raise _unreachable("Redis" if variable == "DROVER_REDIS_URL" else what, variable,
                               url, problem)


class WorkerCannotStart(RuntimeError):
    """Why this worker would fail every sub-agent; ``exit_code`` 2 (settings) or 3 (services)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def has_credentials(settings: Settings) -> bool:
    return bool(settings.anthropic_api_key or os.environ.get("ANTHROPIC_AUTH_TOKEN"))


def tool_module_problem(name: str, error: BaseException) -> str:
    """What to say about a DROVER_TOOL_MODULES entry that raised ``error`` on import."""
    if isinstance(error, ModuleNotFoundError) and error.name == name:
        return (f"the tool module {name!r} (DROVER_TOOL_MODULES) is not importable here: "
                "no module of that name on sys.path. Put its directory on PYTHONPATH (or run "
                "from it), or take it out of DROVER_TOOL_MODULES")
    frames = traceback.extract_tb(error.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return (f"the tool module {name!r} (DROVER_TOOL_MODULES) does not import: "
            f"{type(error).__name__}: {error}{where}. Fix it, or take it out of "
            "DROVER_TOOL_MODULES")


def check_worker(settings: Settings, *, services: bool = True) -> None:
    """Raise WorkerCannotStart if this worker could not run a single sub-agent."""
    if not has_credentials(settings) and not settings.anthropic_base_url:
        raise WorkerCannotStart(
            "no API key: set ANTHROPIC_API_KEY on the worker's host (it never travels in a "
            "task), or set DROVER_ANTHROPIC_BASE_URL to a proxy that needs none. drover's "
            "simulator takes any key: `drover sim --port 8080`, then "
            "DROVER_ANTHROPIC_BASE_URL=http://127.0.0.1:8080 ANTHROPIC_API_KEY=sk-sim", 2)
    for name in settings.tool_modules:
        try:
            importlib.import_module(name)
        except Exception as error:  # any error while importing it: the worker would lack it
            raise WorkerCannotStart(tool_module_problem(name, error), 2) from None
    if services:
        try:
            check_services(settings)
        except Unreachable as error:
            raise WorkerCannotStart(str(error), 3) from None
    if not has_credentials(settings):
        print(f"drover worker: warning: no ANTHROPIC_API_KEY; requests to "
              f"{mask_url(settings.anthropic_base_url or '')} go without a key, and if it "
              "needs one every sub-agent fails with authentication_error",
              file=sys.stderr, flush=True)


