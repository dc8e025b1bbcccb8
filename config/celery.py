"""The Celery configuration, built from drover's settings.

JSON only (task messages are readable in Flower and never unpickled), late acks with a
prefetch of one (a killed worker's task goes back to the queue instead of being lost).

Two brokers (``DROVER_BROKER_URL``); Redis always holds the limiter, job state and results:

- **Redis** (the default: one server for everything). Its ``visibility_timeout`` is the last
  line of defence, not the recovery path (drover's heartbeats and claims re-send a dead
  worker's tasks within seconds, see workers/recovery/sweep.py); Settings has checked that it
  exceeds the longest countdown plus task run, so a retry waiting in a worker's memory is never
  delivered twice by the broker itself.
- **RabbitMQ** (``amqp://``, what Celery recommends for production). Classic durable queues
  with persistent messages: a queued sub-agent survives a broker restart, and a consumer's
  unacked messages go back to the queue the moment its connection drops. A retry's countdown
  waits in the worker's memory, unacked, for exactly that countdown (Settings keeps
  ``DROVER_COUNTDOWN_CAP_S`` far below RabbitMQ's 30-minute consumer timeout); a dead
  worker's countdowns are re-sent by drover's sweep at once and come back from RabbitMQ too
  (a stale copy then stops before any call). Quorum queues with Celery's native delayed
  delivery were tried on RabbitMQ 3.10: retries stayed stuck in the delay queues (their
  at-least-once dead-lettering), so they are not used. Publisher confirms: a send returns
  once the broker has the message.
"""

from __future__ import annotations

import math
from typing import Any

from drover.config.sentinel import is_sentinel
from drover.config.settings import Settings
from drover.config.sockets import keepalive_options, redis_socket_options


def restore_interval_s(settings: Settings) -> int:
    """How often a worker looks for unacked tasks older than the visibility timeout.

    Kombu's own default sweeps every 10 s but scans only on every 10th sweep (100 s); drover
    scans on every sweep, at most every 10 s and at least 10 times per visibility timeout, so
    a killed worker's tasks come back within ``visibility_timeout_s`` plus this.
    """
    return max(1, min(10, settings.visibility_timeout_s // 10))


def restore_mutex_s(settings: Settings) -> int:
    """How long kombu's lock on that scan (``unacked_mutex``) lives if its holder never lets
    go of it.

    Kombu takes it with SET NX and a 5-minute expiry. A scan that starts while Redis does not
    answer (paused, a connection gone silent) times out on the client, but the SET waits in
    the socket and runs when Redis is back: the lock is then held by nobody for 5 minutes and
    no worker hands out a task taken but never acked (a consumer that reconnected dropped
    what it had prefetched) until it expires (CI of dc6d2b9, test_redis_away). A scan takes
    a few round trips; two at once are harmless (each message is restored in a WATCHed
    transaction), so the lock only needs to outlive one scan on a slow Redis."""
    return max(5, math.ceil(2 * settings.socket_timeout_s), restore_interval_s(settings))


def rabbitmq_config(settings: Settings) -> dict[str, Any]:
    """A connection that goes silent (no FIN, no RST) is noticed by the AMQP heartbeat on the
    consumer's (two missed: closed, a new one made; RabbitMQ's side misses them too and puts
    the messages it had delivered without an ack back in the queue) and by the socket's read
    and write timeouts on a publisher's (a publish waiting for its confirm gives up, and
    Celery's publish retry sends it again on a new connection)."""
    return {
        "broker_transport_options": {
            "confirm_publish": True,
            # py-amqp's socket options (SO_RCVTIMEO/SO_SNDTIMEO, TCP keepalive timings).
            "read_timeout": settings.socket_timeout_s,
            "write_timeout": settings.socket_timeout_s,
            "socket_settings": keepalive_options(settings.keepalive_s),
        },
        "task_default_delivery_mode": "persistent",
        # A killed worker's connection is noticed within seconds, not minutes.
        "broker_heartbeat": settings.broker_heartbeat_s,
        # A worker that replaces a silent connection declares its remote-control (pidbox) and
        # event queues again before RabbitMQ has closed the old connection: an exclusive queue
        # is still locked by it then (RESOURCE_LOCKED, which Celery treats as unrecoverable:
        # the worker exited). Non-exclusive, they still go when unused (auto-delete, expiry).
        "control_queue_exclusive": False,
        "event_queue_exclusive": False,
        # Its monitoring events without publisher confirms: on a silent connection each
        # waited the read timeout on the consumer's thread (workers/tasklayer/_consumer.py).
        "worker_consumer": "drover.workers.tasklayer._consumer:Consumer",
    }


def redis_broker_timeouts(settings: Settings) -> dict[str, Any]:
    """Kombu's Redis transport options against a connection that goes silent: a timeout on
    every command (a publish, an ack; longer than its BRPOP's 1 s block), keepalive, and
    kombu's own check of the consumer's BRPOP and pub/sub connections every
    ``health_check_interval``, which drops one whose reply is overdue by that much."""
    return {**redis_socket_options(settings), "retry_on_timeout": True}


SENTINEL_TRANSPORT = "drover.workers.connections.sentinel_transport:Transport"
# kombu's Redis transport whose connections reconnect once one of them went silent, so the
# consumer waits out one socket timeout after a silence, not one per pooled connection
# (drover/workers/connections/silence.py).
REDIS_TRANSPORT = "drover.workers.connections.redis_transport:Transport"


def sentinel_options(settings: Settings) -> dict[str, Any]:
    """Transport options for a ``sentinel://`` broker or result backend (kombu and Celery take
    the same ones: ``master_name``, and ``sentinel_kwargs`` for the sentinels' own connections,
    their password among them: celery#3945 was the backend without it)."""
    sentinel_kwargs: dict[str, Any] = {"socket_connect_timeout": 5, "socket_timeout": 5}
    if settings.sentinel_password is not None:
        sentinel_kwargs["password"] = settings.sentinel_password.get_secret_value()
    return {"master_name": settings.sentinel_master, "sentinel_kwargs": sentinel_kwargs}


def celery_config(settings: Settings) -> dict[str, Any]:
    transport = {
        "visibility_timeout": settings.visibility_timeout_s,
        "unacked_restore_interval": restore_interval_s(settings),
        "unacked_restore_throttle": 1,
        "unacked_mutex_expire": restore_mutex_s(settings),
        # A key prefix of our own keeps tests and several deployments apart on one Redis.
        "global_keyprefix": f"{settings.key_prefix}:celery:",
        **redis_broker_timeouts(settings),
    }
    backend_transport: dict[str, Any] = {
        "global_keyprefix": f"{settings.key_prefix}:celery:",
        # Not Celery's: drover's app (workers/tasklayer/app.py) hands them to the backend's sockets.
        "socket_keepalive_options": keepalive_options(settings.keepalive_s)}
    sentinel_broker = is_sentinel(settings.broker)
    if sentinel_broker:
        transport.update(sentinel_options(settings))
    if is_sentinel(settings.backend):
        backend_transport.update(sentinel_options(settings))
    config = {
        "broker_url": settings.broker,
        "result_backend": settings.backend,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_default_queue": settings.queue,
        "task_time_limit": settings.task_time_limit_s,
        "task_soft_time_limit": settings.task_time_limit_s - 5,
        "result_expires": settings.result_ttl_s,
        "result_extended": False,
        "task_track_started": True,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "broker_transport_options": transport,
        "result_backend_transport_options": backend_transport,
        # Sending a task (a retry, the chord's join) rides out a connection lost mid-publish
        # for about a minute (Celery's default gives up after ~1 s). A broker that is down
        # outright still fails it within kombu's connect timeout (``default_channel`` tries
        # for ``broker_connection_timeout``, 4 s): a retry's publish then tries again
        # (workers/tasklayer/_delivery.py), the fan-out's too (workers/tasklayer/dispatch.py).
        "task_publish_retry_policy": {"max_retries": 40, "interval_start": 0,
                                      "interval_step": 0.5, "interval_max": 2},
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        # The result backend's Redis: the same timeouts (its keepalive timings: Celery has no
        # setting for them, drover's app adds them; see backend_transport above).
        "redis_socket_timeout": settings.socket_timeout_s,
        "redis_socket_connect_timeout": redis_socket_options(settings)["socket_connect_timeout"],
        "redis_backend_health_check_interval": settings.health_check_s,
        "redis_retry_on_timeout": True,
        # A task's result stored while Redis is away (paused, failing over, silent) waits for
        # it: redis-py's own retries of the backend's client give up within about 40 s, and a
        # store that fails marks the sub-agent's task FAILURE, which fails its chord (the
        # sweep then joins the job two minutes later, with a traceback per task).
        "result_backend_always_retry": True,
        "result_backend_max_retries": 20,
        "redis_socket_keepalive": True,
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        # After a reconnect Celery lowers the prefetch count and raises it again from each
        # task's ack callback, which on the thread pool runs in the task's thread: a
        # ``basic.qos`` there waits for its reply on the consumer's connection while the
        # consumer's loop reads the same socket. Two readers split the frames: the consumer
        # waited 10-20 s for a qos-ok another thread had read, then failed with py-amqp's
        # UnexpectedFrame, again on each new connection (the consumer that did not come
        # back after its broker connection went silent, issue 53). Without the reduction
        # only the consumer's loop reads its connection; the cost is a full prefetch at
        # once after a reconnect.
        "worker_enable_prefetch_count_reduction": False,
        "worker_hijack_root_logger": False,
    }
    if sentinel_broker:
        # kombu's own Sentinel transport with a connection that finds the new master after a
        # failover (drover/workers/connections/sentinel_transport.py says why).
        config["broker_transport"] = SENTINEL_TRANSPORT
    elif settings.broker.startswith("redis://"):
        config["broker_transport"] = REDIS_TRANSPORT
    if settings.broker_is_rabbitmq:
        config.update(rabbitmq_config(settings))
    return config
