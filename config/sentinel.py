"""Redis Sentinel lists in kombu's form: ``sentinel://[:PASSWORD@]HOST:PORT[/DB];...``.

The settings check the form; ``drover.workers.connections.redis_clients`` makes the clients.
Like kombu's transport and Celery's result backend, the first entry's password and database are the
master's; the sentinels' own password is a setting of its own (DROVER_SENTINEL_PASSWORD).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = ["DEFAULT_SENTINEL_PORT", "SENTINEL_SCHEME", "SentinelTarget", "is_sentinel",
           "parse_sentinel"]

SENTINEL_SCHEME = "sentinel"
DEFAULT_SENTINEL_PORT = 26379


def is_sentinel(url: str) -> bool:
    return url.strip().lower().startswith(f"{SENTINEL_SCHEME}://")


@dataclass(frozen=True)
class SentinelTarget:
    """A parsed Sentinel list: where the sentinels are and how to log in to the master."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None

    def master_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"db": self.db}
        if self.username:
            options["username"] = self.username
        if self.password:
            options["password"] = self.password
        return options

    def sentinel_options(self, timeout: float) -> dict[str, Any]:
        options: dict[str, Any] = {"socket_connect_timeout": timeout, "socket_timeout": timeout}
        if self.sentinel_password:
            options["password"] = self.sentinel_password
        return options


def parse_sentinel(url: str, master: str | None,
                   sentinel_password: str | None = None) -> SentinelTarget:
    """Parse kombu's ``sentinel://...;sentinel://...`` list; ValueError says what is wrong.

    Like kombu and Celery's backend, the first entry's password and database are used."""
    sentinels: list[tuple[str, int]] = []
    username = password = None
    db = 0
    for index, chunk in enumerate(part.strip() for part in url.split(";")):
        if not chunk:
            continue
        parts = urlsplit(chunk)
        if parts.scheme != SENTINEL_SCHEME:
            raise ValueError(f"entry {chunk.partition('@')[2] or chunk!r} of the Sentinel list "
                             "is not sentinel://HOST:PORT; separate the entries with ';'")
        try:
            port = parts.port or DEFAULT_SENTINEL_PORT
        except ValueError:
            raise ValueError(f"entry {index + 1} of the Sentinel list has a port that is not a "
                             "number from 1 to 65535") from None
        if not parts.hostname:
            raise ValueError(f"entry {index + 1} of the Sentinel list has no host")
        if index == 0:
            username = unquote(parts.username) if parts.username else None
            password = unquote(parts.password) if parts.password else None
            path = parts.path.strip("/")
            if path and not path.isdigit():
                raise ValueError(f"the database {path!r} (after the first sentinel) is not a "
                                 "number (0, 1, ...)")
            db = int(path or 0)
        sentinels.append((parts.hostname, port))
    if not sentinels:
        raise ValueError("the Sentinel list names no sentinel")
    if not master:
        raise ValueError("a Sentinel list needs the master's name: set DROVER_SENTINEL_MASTER "
                         "to the name the sentinels monitor (`sentinel monitor NAME ...`)")
    return SentinelTarget(tuple(sentinels), master, db, username, password, sentinel_password)
