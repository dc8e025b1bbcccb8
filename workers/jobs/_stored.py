"""How the job store's parts write what they keep: records and states as compact JSON, a
finished sub-agent's state compressed past a size, and pipelines whose scripts are loaded.

Private to ``workers/jobs``: the parts (``specs``, ``meta``, ``record_store``, ...) share it.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import redis

from drover.workers.jobs.records import Checkpoint

PACK_FROM = 512  # bytes of a final state's JSON past which it is stored compressed
PAGE = 500  # records read or written per round trip when a job's records are walked in bulk


def compact_json(model: Any) -> str:
    """A record or state as stored: its JSON without the fields at their defaults (a record's
    dozen zero usage counters are most of a short one's size)."""
    return model.model_dump_json(exclude_defaults=True)


def pack_final(state: Checkpoint) -> bytes:
    """A sub-agent's final state as the job's ``final`` hash keeps it: its JSON, compressed
    (zlib) once past ``PACK_FROM`` bytes (answers are text: a 2,000-token one takes a third)."""
    data = compact_json(state).encode()
    return zlib.compress(data, 6) if len(data) > PACK_FROM else data


def unpack_final(raw: bytes | str) -> Checkpoint:
    if isinstance(raw, bytes) and raw[:1] != b"{":
        raw = zlib.decompress(raw)
    return Checkpoint.model_validate_json(raw)


def field(fields: dict[Any, Any], name: str) -> Any:
    """A stream entry's field, whether the client decodes replies or not."""
    return fields.get(name.encode(), fields.get(name))


def execute_loaded(queued: Callable[[], redis.client.Pipeline]) -> list[Any]:
    """Run the pipeline ``queued()`` builds, taking its scripts to be loaded already.

    redis-py checks a pipeline's scripts with a SCRIPT EXISTS round trip of its own before
    every execute; a script is loaded once per Redis server, so that check is skipped. Should
    Redis have lost the scripts (a restart), the pipeline fails before its one script ran
    (the other commands only read) and is built and run again the usual way, which loads them.
    That fallback is needed either way: redis-py's own check does not cover a restart between
    it and the execute (its retry after the reconnect sends EVALSHA to a server without the
    script), which test_crash_recovery's Redis restart hits.
    """
    pipe = queued()
    pipe.scripts.clear()
    try:
        return pipe.execute()
    except redis.exceptions.NoScriptError:
        return queued().execute()
