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


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_asking_a_silent_sentinel_for_the_master_ends_within_its_socket_timeout(flavour):
    """A sentinel whose connection carries no byte back (a NAT's dropped state, a failover in
    progress; here a listener that never reads: the kernel completes the handshake, nobody
    answers) makes the master lookup fail after the sentinels' socket timeout, drover's
    (the connect timeout it is given), not block the client for good nor for redis-py's
    own default. The lookup ends with MasterNotFoundError, and the connections it read from
    the sentinel carried that timeout (the join's bound is only a hang detector)."""
    import asyncio
    import socket
    import threading

    from drover.workers.connections.redis_clients import async_redis, sync_redis

    silent = socket.create_server(("127.0.0.1", 0), backlog=16)
    url = f"sentinel://127.0.0.1:{silent.getsockname()[1]}"
    timeout_s = 0.5
    outcome: list[BaseException | str] = []
    clients: list[object] = []

    def look_up() -> None:
        try:
            if flavour == "sync":
                client = sync_redis(url, master="mymaster", retries=False,
                                    socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
                clients.append(client)
                client.connection_pool.get_master_address()
            else:
                async def ask() -> None:
                    client = async_redis(url, master="mymaster",
                                         socket_connect_timeout=timeout_s,
                                         socket_timeout=timeout_s)
                    clients.append(client)
                    await client.connection_pool.get_master_address()

                asyncio.run(ask())
            outcome.append("answered")
        except BaseException as error:  # what ended it is the finding
            outcome.append(error)

    thread = threading.Thread(target=look_up, daemon=True)
    try:
        thread.start()
        thread.join(60 * timeout_s)
        assert not thread.is_alive(), "the master lookup blocked on a silent sentinel"
    finally:
        silent.close()
    # redis.sentinel's MasterNotFoundError, or redis.asyncio.sentinel's (a class of its own)
    assert len(outcome) == 1 and type(outcome[0]).__name__ == "MasterNotFoundError", outcome
    pools = [s.connection_pool for s in clients[0].connection_pool.sentinel_manager.sentinels]
    used = [c for pool in pools
            for c in [*pool._available_connections, *pool._in_use_connections]]
    assert used and {c.socket_timeout for c in used} == {timeout_s}, [
        c.socket_timeout for c in used]
