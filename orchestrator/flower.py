"""``drover flower``: Flower on drover's Celery app, never open to a network without a password.

It is ``celery -A workers.app flower`` with three differences:

- It listens on 127.0.0.1 unless told otherwise (Flower's own default is every interface).
- Beyond loopback it refuses to start without HTTP basic auth: Flower can revoke and
  terminate tasks and shows every task's arguments and results to whoever opens it.
- The credentials are handed to Flower through its ``FLOWER_BASIC_AUTH`` environment
  variable, never on a command line, where ``ps`` would show them to every user of the host.
  Set them in ``DROVER_FLOWER_BASIC_AUTH`` (``user:password``, several separated by commas).

The broker is the app's (``DROVER_BROKER_URL``/``DROVER_REDIS_URL``, with drover's key
prefix), so Flower sees exactly the workers and queues that ``drover worker`` uses. Task
events are on in ``config.celery`` (``worker_send_task_events``, ``task_send_sent_event``),
which Flower's task list needs.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from dataclasses import dataclass, field

AUTH_ENV = "DROVER_FLOWER_BASIC_AUTH"
DEFAULT_ADDRESS = "127.0.0.1"

__all__ = ["AUTH_ENV", "FlowerArgs", "FlowerRefused", "is_loopback", "parse_args", "run_flower"]


class FlowerRefused(ValueError):
    """What is wrong with the options, said so the user knows what to set."""


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


def _check_credentials(credentials: list[str]) -> None:
    for item in credentials:
        user, colon, password = item.partition(":")
        if not (user and colon and password):
            # Never echo the value: it may be a password typed in the wrong place.
            raise FlowerRefused(
                f"{AUTH_ENV} / --basic-auth must be user:password (several separated by "
                "commas); one entry is not")


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
    if not is_loopback(address) and not credentials:
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


def run_flower(args: list[str]) -> int:
    """``drover flower [flower options]``; returns the exit status."""
    if any(a in ("-h", "--help") for a in args):
        return _celery(["flower", "--help"])
    try:
        argv, credentials = resolve(args, dict(os.environ))
    except FlowerRefused as error:
        print(f"drover flower: {error}", file=sys.stderr)
        return 2
    if any(a.startswith("--basic") for a in args):
        print("drover flower: a password on the command line is visible in `ps` and the shell "
              f"history; prefer {AUTH_ENV}", file=sys.stderr)
    os.environ.pop(AUTH_ENV, None)
    if credentials:
        os.environ["FLOWER_BASIC_AUTH"] = ",".join(credentials)
    return _celery(argv)


def _celery(argv: list[str]) -> int:
    from workers.app import app

    return int(app.start(argv) or 0)
