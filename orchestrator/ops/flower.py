"""``drover flower``: Flower on drover's Celery app, never open to a network without a password.

It is ``celery -A drover.workers.app flower`` with three differences:

- It listens on 127.0.0.1 unless told otherwise (Flower's own default is every interface).
- Beyond loopback it refuses to start without HTTP basic auth: Flower can revoke and
  terminate tasks and shows every task's arguments and results to whoever opens it.
- The credentials are handed to Flower through its ``FLOWER_BASIC_AUTH`` environment
  variable, never on a command line, where ``ps`` would show them to every user of the host.
  Set them in ``DROVER_FLOWER_BASIC_AUTH`` (``user:password``, several separated by commas).

The broker is the app's (``DROVER_BROKER_URL``/``DROVER_REDIS_URL``, with drover's key
prefix), so Flower sees exactly the workers and queues that ``drover worker`` uses. Task
events are on in ``drover.config.celery`` (``worker_send_task_events``, ``task_send_sent_event``),
which Flower's task list needs.

It also sets defaults for what an operator of drover needs to see (``flower_defaults``): the
task columns with args, result, retries and the retry exception; runtime histogram buckets
in ``/metrics`` up to the longest task run (``DROVER_TASK_TIME_LIMIT_S``); and offline
workers purged after ten minutes (a killed worker otherwise stays listed, and
``flower_worker_online`` stays 1, for ever). They are handed over as ``FLOWER_*``
environment variables that are not set already: Flower reads its environment first, then
its config file, then its command line, so each of those overrides them.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from dataclasses import dataclass, field

from drover._signals import FlowerRefused

AUTH_ENV = "DROVER_FLOWER_BASIC_AUTH"
DEFAULT_ADDRESS = "127.0.0.1"
# args are ``job=<id> sub=<i>/<n>``, result starts with the sub-agent's status, exception is
# the last retry's reason.
TASK_COLUMNS = "name,uuid,state,args,result,retries,exception,received,runtime,worker"
RUNTIME_BUCKETS_S = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)
PURGE_OFFLINE_WORKERS_S = 600
# Basic auth beyond loopback faces whatever can reach the port: refuse short passwords.
MIN_PASSWORD_CHARS = 12

HELP = f"""\
usage: drover flower [--address=ADDR] [--port=PORT] [--basic-auth=USER:PASSWORD] [flower options]

Start Flower (celery -A drover.workers.app flower) on drover's broker (DROVER_BROKER_URL, else
DROVER_REDIS_URL, with drover's key prefix), so it sees the workers and queues drover uses.

drover's rules:
  --address=ADDR   listen address (default: {DEFAULT_ADDRESS}, loopback only; Flower's own
                   default is every interface). FLOWER_ADDRESS is read too.
  --port=PORT      listen port (default: Flower's, 5555)
  passwords        beyond loopback Flower refuses to start without HTTP basic auth, and
                   each password must have at least {MIN_PASSWORD_CHARS} characters: Flower can
                   revoke and terminate tasks and shows their arguments and results. Set
                   {AUTH_ENV}=user:password (several: u1:pw1,u2:pw2);
                   drover hands it to Flower through FLOWER_BASIC_AUTH, never on a command
                   line that `ps` shows. --basic-auth works too, with a warning.
  JSON API         Flower answers its /api/* endpoints with 401 unless basic auth is set or
                   FLOWER_UNAUTHENTICATED_API=true is in the environment (Flower's own
                   setting). On loopback without a password, set it to script against the
                   API, e.g. FLOWER_UNAUTHENTICATED_API=true drover flower; with a password,
                   use curl -u user:password http://HOST:5555/api/workers.
  what it knows    only the tasks it saw live (the workers' events, kept in its memory): a
                   job that ran before Flower started or while it was down is not there;
                   drover result JOB and drover watch JOB read the job from Redis.

drover's defaults (each yields to a FLOWER_* variable, flowerconfig.py or the command line):
  --tasks_columns={TASK_COLUMNS}
  --task_runtime_metric_buckets=0.5,...,DROVER_TASK_TIME_LIMIT_S
  --purge_offline_workers={PURGE_OFFLINE_WORKERS_S}
  /metrics answers without the password: see docs/monitoring.md (Flower).

Exit status: 2 refused (address without a password, a short or malformed password) or the
port is taken; 3 the broker does not answer; otherwise Flower's. Flower's own options follow.
"""

__all__ = ["AUTH_ENV", "FlowerArgs", "FlowerRefused", "default_environment", "flower_defaults",
           "is_loopback", "parse_args", "run_flower"]


@dataclass
class FlowerArgs:
    address: str | None = None
    port: str | None = None
    unix_socket: str | None = None
    basic_auth: list[str] = field(default_factory=list)
    rest: list[str] = field(default_factory=list)  # everything else, for Flower as given


_OURS = {"address", "port", "unix_socket", "unix-socket", "basic_auth", "basic-auth"}


def parse_args(args: list[str]) -> FlowerArgs:
    """Pick out the options drover checks; both ``--opt=value`` and ``--opt value`` work."""
    out = FlowerArgs()
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.lstrip("-").partition("=")
        if not arg.startswith("--") or name not in _OURS:
            out.rest.append(arg)
            i += 1
            continue
        if not eq:
            if i + 1 >= len(args):
                raise FlowerRefused(f"{arg} needs a value")
            value = args[i + 1]
            i += 1
        i += 1
        key = name.replace("-", "_")
        if key == "basic_auth":
            out.basic_auth += [v for v in value.split(",") if v]
        else:
            setattr(out, key, value)
    return out


def is_loopback(address: str) -> bool:
    """True when ``address`` is reachable from this host only."""
    if address in ("", "0.0.0.0", "::", "*"):
        return False  # every interface
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        pass
    try:  # a host name: loopback only if every address it resolves to is
        infos = socket.getaddrinfo(address, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def _check_credentials(credentials: list[str], *, beyond_loopback: bool = False) -> None:
    for item in credentials:
        user, colon, password = item.partition(":")
        if not (user and colon and password):
            # Never echo the value: it may be a password typed in the wrong place.
            raise FlowerRefused(
                f"{AUTH_ENV} / --basic-auth must be user:password (several separated by "
                "commas); one entry is not")
        if beyond_loopback and len(password) < MIN_PASSWORD_CHARS:
            raise FlowerRefused(
                f"the password of user {user!r} in {AUTH_ENV} / --basic-auth is shorter than "
                f"{MIN_PASSWORD_CHARS} characters; Flower beyond loopback needs a longer one "
                "(e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(16))')")


def resolve(args: list[str], environ: dict[str, str]) -> tuple[list[str], list[str]]:
    """(arguments for ``celery flower``, basic-auth credentials); raise FlowerRefused."""
    parsed = parse_args(args)
    credentials = parsed.basic_auth
    for name in (AUTH_ENV, "FLOWER_BASIC_AUTH"):
        if not credentials and environ.get(name):
            credentials = [v for v in environ[name].split(",") if v]
    _check_credentials(credentials)
    argv = ["flower", *parsed.rest]
    if parsed.unix_socket:
        argv.append(f"--unix_socket={parsed.unix_socket}")
        return argv, credentials
    address = parsed.address if parsed.address is not None else environ.get(
        "FLOWER_ADDRESS", DEFAULT_ADDRESS)
    beyond = not is_loopback(address)
    _check_credentials(credentials, beyond_loopback=beyond)
    if beyond and not credentials:
        shown = address or "every interface"
        raise FlowerRefused(
            f"refusing to start Flower on {shown} without a password: Flower can revoke and "
            f"terminate tasks and shows their arguments and results to whoever opens it. Set "
            f"{AUTH_ENV}=user:password (or pass --basic-auth=user:password), or listen on "
            f"{DEFAULT_ADDRESS} only (--address={DEFAULT_ADDRESS}, the default)")
    # Flower's option parser (tornado) only takes --name=value.
    argv.append(f"--address={address}")
    if parsed.port is not None:
        argv.append(f"--port={parsed.port}")
    return argv, credentials


def flower_defaults(task_time_limit_s: float) -> dict[str, str]:
    """drover's Flower options (by Flower's option name), for a given longest task run."""
    buckets = [b for b in RUNTIME_BUCKETS_S if b < task_time_limit_s] + [task_time_limit_s]
    return {"tasks_columns": TASK_COLUMNS,
            "task_runtime_metric_buckets": ",".join(f"{b:g}" for b in buckets),
            "purge_offline_workers": str(PURGE_OFFLINE_WORKERS_S)}


def default_environment(environ: dict[str, str], task_time_limit_s: float) -> dict[str, str]:
    """The ``FLOWER_*`` variables to add: drover's defaults the user has not set there."""
    out = {}
    for name, value in flower_defaults(task_time_limit_s).items():
        variable = f"FLOWER_{name.upper()}"
        if variable not in environ:
            out[variable] = value
    return out


def run_flower(args: list[str]) -> int:
    """``drover flower [flower options]``; returns the exit status."""
    if any(a in ("-h", "--help") for a in args):
        print(HELP, flush=True)
        return _celery(["flower", "--help"])
    try:
        argv, credentials = resolve(args, dict(os.environ))
    except FlowerRefused as error:
        print(f"drover flower: {error}", file=sys.stderr)
        return 2
    if problem := _broker_problem():
        print(f"drover flower: {problem}", file=sys.stderr)
        return 3
    if any(a.startswith("--basic") for a in args):
        print("drover flower: a password on the command line is visible in `ps` and the shell "
              f"history; prefer {AUTH_ENV}", file=sys.stderr)
    os.environ.pop(AUTH_ENV, None)
    if credentials:
        os.environ["FLOWER_BASIC_AUTH"] = ",".join(credentials)
    from drover.config import get_settings

    os.environ.update(default_environment(dict(os.environ),
                                          get_settings().task_time_limit_s))
    try:
        return _celery(argv)
    except OSError as error:  # tornado could not bind: the port is taken, or the address wrong
        where = " ".join(a for a in argv if a.startswith(("--address", "--port", "--unix")))
        print(f"drover flower: cannot listen ({where}): {error.strerror or error}; pick "
              "another --port or --address", file=sys.stderr)
        return 2


def _broker_problem() -> str | None:
    """Why Flower would show nothing: the broker does not answer (one short attempt)."""
    from drover.config import get_settings
    from drover.config.settings import mask_url
    from drover.workers.connections.preflight import FIRST_CONTACT_TIMEOUT_S, broker_problem

    settings = get_settings()
    problem = broker_problem(settings.broker)
    if problem is None:
        return None
    variable = "DROVER_BROKER_URL" if settings.broker_url else "DROVER_REDIS_URL"
    return (f"cannot reach the broker at {mask_url(settings.broker)} ({variable}): {problem} "
            f"(one attempt, connect timeout {FIRST_CONTACT_TIMEOUT_S:g} s). Start it, or set "
            f"{variable} to the URL of one that runs")


def _celery(argv: list[str]) -> int:
    from drover.workers.app import app

    return int(app.start(argv) or 0)
