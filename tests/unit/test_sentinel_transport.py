"""The Sentinel broker transport's channel, once its connection is closed, says so as a
connection error (which Celery's consumer reconnects from), not kombu's AttributeError (which
Celery reports as an unrecoverable error and the worker exits: seen after a failover, both
workers of tests/system/test_failover.py's Redis-broker run gone beside a CPU hog)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from drover.workers.connections.sentinel_transport import Channel, Transport


def test_a_channel_of_a_closed_connection_raises_a_connection_error():
    channel = Channel.__new__(Channel)  # no server: only the parameters are asked for
    # kombu's Connection._close sets the transport's client to None
    channel.connection = SimpleNamespace(client=None)
    with pytest.raises(RedisConnectionError, match="broker connection was closed"):
        channel._connparams()
    assert issubclass(RedisConnectionError, tuple(Transport.connection_errors))
