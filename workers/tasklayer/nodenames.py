"""A Celery node name of its own for each ``drover worker`` on a host.

Celery names every node ``celery@<host>``; two workers on one host would share it (Flower
shows one worker, Celery warns ``DuplicateNodenameWarning`` and remote control reaches either).
``drover worker`` without ``-n`` takes the first free name of ``celery@host``,
``celery2@host``, ``celery3@host``...: free when no live process on this host holds it. The
holder is a Redis key per name holding the worker's pid; the key names the host, so only
processes of this host compete for it and ``os.kill(pid, 0)`` says whether its holder lives
(a worker killed with ``kill -9`` leaves a key whose name is free again at once). So a single
worker per host (a container) keeps Celery's own ``celery@<host>`` across restarts.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket

import redis

__all__ = ["claim_node_name", "names_a_node"]

# The claim outlives any worker's run; a stale one is taken over once its pid is gone.
CLAIM_TTL_S = 7 * 24 * 3600


def names_a_node(argv: list[str]) -> bool:
    """Whether ``celery worker`` arguments already name the node (``-n``/``--hostname``)."""
    return any(a in ("-n", "--hostname") or a.startswith(("--hostname=", "-n="))
               or (a.startswith("-n") and len(a) > 2) for a in argv)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def claim_node_name(client: redis.Redis, prefix: str, host: str | None = None,
                    pid: int | None = None) -> str:
    """The first node name on this host that no live worker holds, now held by ``pid``."""
    host = host or socket.gethostname()
    pid = pid or os.getpid()
    for n in range(1, 1000):
        name = f"celery{n if n > 1 else ''}@{host}"
        key = f"{prefix}:node:{name}"
        if _take(client, key, pid):
            atexit.register(_release, client, key, pid)
            return name
    raise RuntimeError(f"no free Celery node name on {host}: pass -n NAME@%h")


def _take(client: redis.Redis, key: str, pid: int) -> bool:
    """Hold ``key`` for ``pid`` if it is free, ours already, or held by a dead process."""
    with client.pipeline() as pipe:
        try:
            pipe.watch(key)  # another starter on this host taking it first aborts ours
            holder = pipe.get(key)
            try:
                holder_pid = int(holder or 0)
            except ValueError:
                holder_pid = 0
            if holder_pid and holder_pid != pid and _alive(holder_pid):
                return False
            pipe.multi()
            pipe.set(key, pid, ex=CLAIM_TTL_S)
            pipe.execute()
            return True
        except redis.WatchError:
            return False


def _release(client: redis.Redis, key: str, pid: int) -> None:
    with contextlib.suppress(redis.RedisError):
        if client.get(key) in (str(pid), str(pid).encode()):
            client.delete(key)
