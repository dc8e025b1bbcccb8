"""A connection that goes silent (no FIN, no RST; tests/helpers/tcp_proxy.py) is noticed and
replaced by drover's Redis clients, sync and asyncio, and Celery's are configured to notice it:
a timeout on every command, keepalive, health checks (drover/config/sockets.py)."""

from __future__ import annotations

import asyncio
import socket
from urllib.parse import urlsplit

from drover.config import load_settings
from drover.config.celery import celery_config
from drover.workers.connections.redis_clients import async_redis, client_settings, sync_redis
from tests.helpers.tcp_proxy import TcpProxy


def _proxy(redis_url: str) -> TcpProxy:
    return TcpProxy(urlsplit(redis_url).port or 6379, urlsplit(redis_url).hostname or "")


def test_a_sync_client_answers_again_on_a_new_connection_after_its_own_went_silent(
        redis_url, key_prefix):
    with _proxy(redis_url) as proxy:
        client = sync_redis(proxy.url(), socket_timeout=1.0)
        client.set(f"{key_prefix}:k", "before")
        assert proxy.silence() == 1
        # The pooled connection is a black hole now: the command times out, the connection is
        # dropped, and the retry reaches Redis on a new one.
        assert client.get(f"{key_prefix}:k") == b"before"
        assert proxy.open_connections() == 1
        client.close()


def test_once_one_connection_timed_out_the_others_made_before_it_reconnect_at_once(
        redis_url, key_prefix):
    """Silence-aware connections (drover/workers/connections/silence.py): a pool's second
    silent connection reconnects before its command instead of waiting out a timeout of its
    own (the Celery consumer on the Redis broker waited one per connection, 30 s in all)."""
    import pytest
    import redis

    with _proxy(redis_url) as proxy:
        client = sync_redis(proxy.url(), socket_timeout=1.0, retries=False)
        client.set(f"{key_prefix}:s", "before")
        pool = client.connection_pool
        first, second = pool.get_connection(), pool.get_connection()
        for conn in (first, second):
            conn.send_command("PING")
            assert conn.read_response() == b"PONG"
        assert proxy.silence() == 2
        first.send_command("GET", f"{key_prefix}:s")
        with pytest.raises(redis.TimeoutError):
            first.read_response()
        second.send_command("GET", f"{key_prefix}:s")  # made before the timeout: a new one
        assert second.read_response() == b"before"
        pool.release(first)
        pool.release(second)
        client.close()


def test_an_async_client_answers_again_on_a_new_connection_after_its_own_went_silent(
        redis_url, key_prefix):
    async def run(url: str) -> bytes | None:
        client = async_redis(url, socket_timeout=1.0)
        await client.set(f"{key_prefix}:a", "before")
        proxy.silence()
        try:
            return await client.get(f"{key_prefix}:a")
        finally:
            await client.aclose()

    with _proxy(redis_url) as proxy:
        assert asyncio.run(run(proxy.url())) == b"before"


def test_a_silenced_connection_neither_closes_nor_carries_bytes_while_new_ones_pass(redis_url):
    with _proxy(redis_url) as proxy:
        old = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
        old.sendall(b"PING\r\n")
        assert old.recv(100) == b"+PONG\r\n"
        proxy.silence()
        old.sendall(b"PING\r\n")
        old.settimeout(0.5)
        try:
            got = old.recv(100)
        except TimeoutError:
            got = None
        assert got is None  # no reply, and no EOF either
        new = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
        new.sendall(b"PING\r\n")
        assert new.recv(100) == b"+PONG\r\n"
        old.close()
        new.close()


def test_every_client_has_a_timeout_keepalive_and_health_checks(redis_url):
    settings = load_settings(redis_url=redis_url, socket_timeout_s=7, keepalive_s=6,
                             health_check_s=4)
    ours = client_settings(settings)
    assert ours["socket_timeout"] == 7 and ours["health_check_interval"] == 4
    assert ours["socket_keepalive"] and ours["socket_keepalive_options"][socket.TCP_KEEPIDLE] == 6
    conf = celery_config(settings)
    broker = conf["broker_transport_options"]
    assert broker["socket_timeout"] == 7 and broker["health_check_interval"] == 4
    assert broker["socket_keepalive_options"][socket.TCP_KEEPCNT] == 3
    assert conf["redis_socket_timeout"] == 7 and conf["redis_backend_health_check_interval"] == 4
    # kombu's BRPOP blocks 1 s: a timeout shorter than that would break every idle consumer.
    assert broker["socket_timeout"] > 1

    rabbit = celery_config(load_settings(redis_url=redis_url, socket_timeout_s=7,
                                         broker_heartbeat_s=3,
                                         broker_url="amqp://guest:guest@127.0.0.1:5672//"))
    assert rabbit["broker_heartbeat"] == 3
    # Only the consumer's loop reads its connection (no basic.qos from the tasks' threads),
    # and its monitoring events wait for no confirm on its thread (issue 53).
    assert rabbit["worker_enable_prefetch_count_reduction"] is False
    assert rabbit["worker_consumer"] == "drover.workers.tasklayer._consumer:Consumer"
    assert rabbit["broker_transport_options"]["read_timeout"] == 7
    assert rabbit["broker_transport_options"]["write_timeout"] == 7
    # A worker replacing a silent connection declares these again while RabbitMQ still holds
    # the old one: exclusive, they would be locked by it, and Celery exits on that.
    assert rabbit["control_queue_exclusive"] is False and rabbit["event_queue_exclusive"] is False


def test_a_worker_whose_watched_part_stops_moving_stops_beating_and_beats_again_once_it_moves(
        redis_url, key_prefix):
    from drover.workers.jobs.liveness import Heartbeat, heartbeat_key, stuck_on_its_broker
    from tests.helpers import wait_until

    settings = load_settings(redis_url=redis_url, key_prefix=key_prefix, heartbeat_s=0.2,
                             heartbeat_ttl_s=1, socket_timeout_s=2, progress_stale_s=4.5)
    heartbeat = Heartbeat(settings, client=sync_redis(redis_url, **client_settings(settings)))
    key = heartbeat_key(key_prefix, heartbeat.id)
    try:
        # watched from now on, and then never moves again; it is the broker connection
        heartbeat.pulse("the consumer", broker=True)
        wait_until("the heartbeat key expired", lambda: not heartbeat.r.exists(key), 20)
        assert heartbeat.stuck() == ["the consumer"]
        # it says why, so the sweep counts no death against its sub-agents (issue 53)
        assert stuck_on_its_broker(heartbeat.r, key_prefix, heartbeat.id)
        heartbeat.pulse("the consumer")  # it moves again
        wait_until("the heartbeat back", lambda: heartbeat.r.exists(key), 10)
        assert not stuck_on_its_broker(heartbeat.r, key_prefix, heartbeat.id)
        heartbeat.unwatch("the consumer")  # stopped on purpose (reconnecting): not stuck
        assert heartbeat.stuck() == []
    finally:
        heartbeat.stop()
        heartbeat.r.close()


def test_the_cancel_listener_subscribes_again_when_its_connection_goes_silent(
        redis_url, key_prefix, monkeypatch):
    from drover.config import get_settings
    from drover.workers.agent.runtime import Runtime
    from drover.workers.services import services
    from tests.helpers import wait_until

    with _proxy(redis_url) as proxy:
        monkeypatch.setenv("DROVER_REDIS_URL", proxy.url())
        monkeypatch.setenv("DROVER_KEY_PREFIX", key_prefix)
        monkeypatch.setenv("DROVER_SOCKET_TIMEOUT_S", "2")
        monkeypatch.setenv("DROVER_HEALTH_CHECK_S", "1")
        get_settings.cache_clear()
        runtime = Runtime(services(get_settings()))
        try:
            event = runtime.submit(_cancel_event(runtime, "job-a")).result(5)
            channel = runtime.store.cancels.channel
            subscribers = lambda: runtime.store.r.pubsub_numsub(channel)[0][1]  # noqa: E731
            wait_until("subscribed", lambda: subscribers() >= 1, 10)
            proxy.silence()
            # Redis still counts the silent subscriber; a second one is the new subscription,
            # within a PING interval plus the socket timeout.
            wait_until("subscribed again", lambda: subscribers() >= 2, 20)
            wait_until("the cancel heard", lambda: runtime.store.r.publish(channel, "job-a")
                       and event.is_set(), 10)
        finally:
            runtime.close()
            get_settings.cache_clear()


async def _cancel_event(runtime, job_id: str):  # noqa: ANN001, ANN202
    return runtime.cancel_event(job_id)


def _keepalive(sock: socket.socket) -> tuple[int, int, int, int]:
    return (sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT))


def test_the_keepalive_and_timeout_options_reach_the_sockets_of_every_redis_client(
        redis_url, key_prefix, drover_env):
    """Read back from the kernel, not from our own dicts: the sockets drover's sync and
    asyncio clients and Celery's Redis broker connection open carry SO_KEEPALIVE with
    DROVER_KEEPALIVE_S's timings (idle 6 s, every 2 s, 3 probes) and the socket timeout;
    the result backend's too (Celery has no setting for its timings: drover's app adds them,
    and before they were not DROVER_KEEPALIVE_S's: read here as 30 s idle, every 5 s)."""
    from drover.workers.app import DroverCelery  # under drover_env: the process's app is built

    settings = load_settings(redis_url=redis_url, key_prefix=key_prefix, socket_timeout_s=7,
                             keepalive_s=6)
    wanted = (1, 6, 2, 3)
    client = sync_redis(redis_url, **client_settings(settings))
    client.ping()
    conn = client.connection_pool.get_connection()
    try:
        assert _keepalive(conn._sock) == wanted and conn._sock.gettimeout() == 7
    finally:
        client.connection_pool.release(conn)
        client.close()

    async def async_socket() -> tuple[tuple[int, int, int, int], float | None]:
        aclient = async_redis(redis_url, **client_settings(settings))
        await aclient.ping()
        aconn = await aclient.connection_pool.get_connection()
        try:
            sock = aconn._writer.get_extra_info("socket")
            return _keepalive(sock), aconn.socket_timeout
        finally:
            await aclient.connection_pool.release(aconn)
            await aclient.aclose()

    assert asyncio.run(async_socket()) == (wanted, 7)

    app = DroverCelery("keepalive-check", set_as_current=False)
    app.conf.update(celery_config(settings))
    with app.connection_for_write() as broker:
        channel = broker.default_channel
        channel.client.ping()  # kombu's Redis client of the broker, as publishers use it
        bconn = channel.client.connection_pool.get_connection()
        try:
            assert _keepalive(bconn._sock) == wanted and bconn._sock.gettimeout() == 7
        finally:
            channel.client.connection_pool.release(bconn)
    app.backend.client.ping()
    pool = app.backend.client.connection_pool
    rconn = pool.get_connection()
    try:
        assert _keepalive(rconn._sock) == wanted and rconn._sock.gettimeout() == 7
    finally:
        pool.release(rconn)
