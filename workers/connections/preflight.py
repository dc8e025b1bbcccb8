"""First contact: does this process have what it needs, before it starts working?

``check_services`` is what every CLI command that needs Redis (or the broker) runs first: one
attempt with a short connect timeout (``FIRST_CONTACT_TIMEOUT_S``); when nothing answers, an
``Unreachable`` whose message names the variable, the URL it tried (password masked), what
went wrong and what to do. Without it a command would sit in the clients' reconnect loop
(about a minute, meant for a Redis that restarts under a running job) and end in a traceback.

``check_worker`` adds what a worker needs besides (see ``drover.workers.tasklayer.app``).
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
from drover.config.providers import about
from drover.config.sentinel import SentinelTarget, is_sentinel, parse_sentinel
from drover.config.settings import mask_url
from drover.errors import Unreachable, WorkerCannotStart
from drover.workers.connections.redis_clients import sync_redis

__all__ = ["FIRST_CONTACT_TIMEOUT_S", "Unreachable", "WorkerCannotStart", "broker_problem",
           "check_services", "check_worker", "eviction_problem", "has_credentials",
           "import_tool_modules", "tool_module_problem", "redis_answers", "redis_problem",
           "working_folder_on_path"]

# One attempt, this long, for the first contact: long enough for a Redis across a WAN, short
# enough that a typo in a URL is reported at once.
FIRST_CONTACT_TIMEOUT_S = 3.0


def _sentinels_problem(target: SentinelTarget, timeout: float) -> str | None:
    """None when a sentinel of ``target`` knows its master; else what each one said."""
    said: list[str] = []
    monitored: set[str] = set()
    for host, port in target.sentinels:
        where = f"{host}:{port}"
        client = redis.Redis(host, port, retry=Retry(NoBackoff(), 0),
                             **target.sentinel_options(timeout))
        try:
            with contextlib.closing(client):
                if client.sentinel_get_master_addr_by_name(target.master):
                    return None
                monitored.update(str(name) for name in client.sentinel_masters())
                said.append(f"{where} knows no master {target.master!r}")
        except (redis.AuthenticationError, redis.ResponseError) as error:
            said.append(f"{where} answered with an error ({error}; the sentinels' own password "
                        "is DROVER_SENTINEL_PASSWORD)")
        except redis.TimeoutError:
            said.append(f"{where}: no answer within {timeout:g} s")
        except (redis.RedisError, OSError) as error:
            said.append(f"{where}: {str(error).rstrip('.') or type(error).__name__}")
    if monitored:
        return (f"no sentinel knows a master named {target.master!r} "
                f"(DROVER_SENTINEL_MASTER); they monitor {', '.join(sorted(monitored))}: set "
                f"DROVER_SENTINEL_MASTER to one of those ({'; '.join(said)})")
    if any("knows no master" in line for line in said):
        return (f"no sentinel knows a master named {target.master!r} (DROVER_SENTINEL_MASTER) "
                f"and they monitor none: {'; '.join(said)}")
    return f"no sentinel answered: {'; '.join(said)}"


def redis_problem(url: str, timeout: float = FIRST_CONTACT_TIMEOUT_S, *,
                  master: str | None = None,
                  sentinel_password: str | None = None) -> str | None:
    """None when a Redis answers PING at ``url`` within ``timeout``; else what went wrong.

    ``url`` may be a Sentinel list: then the sentinels are asked for ``master`` (by default
    DROVER_SENTINEL_MASTER) first, so a wrong name and dead sentinels are told apart."""
    try:
        if is_sentinel(url):
            if master is None:
                from drover.config import get_settings

                settings = get_settings()
                master = settings.sentinel_master
                if sentinel_password is None and settings.sentinel_password is not None:
                    sentinel_password = settings.sentinel_password.get_secret_value()
            target = parse_sentinel(url, master, sentinel_password)
            problem = _sentinels_problem(target, timeout)
            if problem is not None:
                return problem
        client = sync_redis(url, master=master, sentinel_password=sentinel_password,
                            retries=False, socket_connect_timeout=timeout,
                            socket_timeout=timeout)
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


def broker_problem(url: str, timeout: float = FIRST_CONTACT_TIMEOUT_S,
                   **sentinel: str | None) -> str | None:
    """Like ``redis_problem`` for a Celery broker URL (Redis, or AMQP through kombu)."""
    if urlsplit(url).scheme in ("redis", "rediss", "unix", "sentinel"):
        return redis_problem(url, timeout, **sentinel)
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
        problem = probe(url, master=settings.sentinel_master,
                        sentinel_password=settings.sentinel_password.get_secret_value()
                        if settings.sentinel_password else None)
        if problem is not None:
            raise _unreachable("Redis" if variable == "DROVER_REDIS_URL" else what, variable,
                               url, problem)


def has_credentials(settings: Settings) -> bool:
    """A key for the provider the workers call (``DROVER_PROVIDER``): its own, or a pool's
    entries of it, each with its credentials (a Bedrock or Vertex AI entry's may be its
    cloud's credential chain: docs/bedrock.md, docs/vertex.md)."""
    if any(settings.key_serves(k) == settings.provider for k in settings.keys):
        return True
    facts = about(settings.provider)
    return bool(facts.api_key(settings)
                or (facts.auth_token_env and os.environ.get(facts.auth_token_env)))


def working_folder_on_path() -> None:
    """Put the working folder first on ``sys.path``, as ``celery worker`` and ``python -m`` do.

    A console script's ``sys.path[0]`` is the script's own folder, so without this a tool
    module next to the job (``my_tools.py`` in the folder ``drover worker`` was started from)
    would not import.
    """
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def import_tool_modules(settings: Settings) -> None:
    """Import the DROVER_TOOL_MODULES (from the working folder too) so their tools register."""
    working_folder_on_path()
    for name in settings.tool_modules:
        importlib.import_module(name)


def tool_module_problem(name: str, error: BaseException) -> str:
    """What to say about a DROVER_TOOL_MODULES entry that raised ``error`` on import."""
    if isinstance(error, ModuleNotFoundError) and error.name == name:
        return (f"the tool module {name!r} (DROVER_TOOL_MODULES) is not importable here: "
                "no module of that name in the working folder or on sys.path. Run from its "
                "folder, put that folder on PYTHONPATH, or take it out of DROVER_TOOL_MODULES")
    frames = traceback.extract_tb(error.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return (f"the tool module {name!r} (DROVER_TOOL_MODULES) does not import: "
            f"{type(error).__name__}: {error}{where}. Fix it, or take it out of "
            "DROVER_TOOL_MODULES")


def eviction_problem(settings: Settings) -> tuple[str, str] | None:
    """("refuse" | "warn", what to say) when the Redis at DROVER_REDIS_URL may evict keys.

    An evicted bucket, lease or claim silently breaks the limits and recovery, so drover
    needs ``noeviction``. ``INFO memory`` is read rather than ``CONFIG GET``: managed Redis
    services often rename or forbid CONFIG, never INFO. ``allkeys-*`` evicts any key: refused.
    ``volatile-*`` evicts keys with a TTL, and every drover key has one: a warning, since a
    Redis that never reaches its maxmemory never evicts."""
    client = sync_redis(settings.redis_url, master=settings.sentinel_master,
                        sentinel_password=settings.sentinel_password.get_secret_value()
                        if settings.sentinel_password else None, retries=False,
                        socket_connect_timeout=FIRST_CONTACT_TIMEOUT_S,
                        socket_timeout=FIRST_CONTACT_TIMEOUT_S)
    with contextlib.closing(client):
        memory = client.info("memory")
    policy = str(memory.get("maxmemory_policy", "noeviction"))
    where = f"the Redis at {mask_url(settings.redis_url)} (DROVER_REDIS_URL)"
    if policy.startswith("allkeys-"):
        return "refuse", (
            f"{where} has maxmemory-policy {policy}: it may evict any key, and an evicted "
            "limiter bucket or claim silently breaks the rate limits and recovery. Set "
            "maxmemory-policy noeviction there (`CONFIG SET maxmemory-policy noeviction`, or "
            "the parameter group of a managed Redis), or give drover a Redis of its own")
    if policy.startswith("volatile-"):
        return "warn", (
            f"{where} has maxmemory-policy {policy}: once it reaches maxmemory it evicts keys "
            "that have a TTL, and every drover key has one (buckets, claims, checkpoints). "
            "Use noeviction, or keep maxmemory well above what the jobs hold")
    return None


def check_worker(settings: Settings, *, services: bool = True) -> None:
    """Raise WorkerCannotStart if this worker could not run a single sub-agent."""
    facts = about(settings.provider)
    key, url = facts.api_key_env, facts.base_url_env
    sim = f"`drover sim{facts.sim_args} --port 8080`, then {url}=http://127.0.0.1:8080"
    if not facts.keyless_endpoint and not has_credentials(settings):
        # Its SDK refuses to build a client without a key (the openai SDK's), whatever the
        # endpoint.
        raise WorkerCannotStart(
            f"no API key: set {key} on the worker's host (it never travels in a task); an "
            f"{facts.display_name}-compatible server that needs none takes any ({key}=none). "
            f"drover's simulator takes any: {sim}{facts.base_url_path} {key}=sk-sim", 2)
    if not has_credentials(settings) and not facts.base_url(settings):
        raise WorkerCannotStart(
            f"no API key: set {key} on the worker's host (it never travels in a task), or set "
            f"{url} to a proxy that needs none. drover's simulator needs a key, as the API "
            f"does, and takes any: {sim}{facts.base_url_path} {key}=sk-sim", 2)
    working_folder_on_path()
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
        try:
            eviction = eviction_problem(settings)
        except redis.RedisError as error:  # it answered PING a moment ago: say so, go on
            eviction = ("warn", f"could not read INFO memory to check maxmemory-policy "
                                f"({error})")
        if eviction is not None and eviction[0] == "refuse":
            raise WorkerCannotStart(eviction[1], 3)
        if eviction is not None:
            print(f"drover worker: warning: {eviction[1]}", file=sys.stderr, flush=True)
    facts = about(settings.provider)
    if not has_credentials(settings):  # a provider's that takes a base URL without a key
        print(f"drover worker: warning: no {facts.api_key_env}; requests to "
              f"{mask_url(facts.base_url(settings) or '')} go without a key, and if it "
              "needs one every sub-agent fails with authentication_error (drover's simulator "
              f"needs one and takes any: {facts.api_key_env}=sk-sim)",
              file=sys.stderr, flush=True)


