"""The Celery consumer of a drover worker (``worker_consumer`` in ``drover.config.celery``):
Celery's own, with monitoring events published without waiting for the broker's confirm.

Its event dispatcher (task events and the worker's heartbeat events, which Flower shows) runs
on the consumer's thread. On RabbitMQ drover turns on publisher confirms for every publish
(``confirm_publish``: a sub-agent's message is on the broker when the send returns), and so
did the dispatcher's: when its connection went silent, each worker-heartbeat event waited the
socket's read timeout (``DROVER_SOCKET_TIMEOUT_S``) for a confirm that never came, holding the
consumer's loop, its AMQP heartbeats and its check of the consumer's own connection for 10 s
(stack samples of the consumer thread, tests/system/test_silent_connections.py). An event is
worth less than that wait: a lost one is a gap in Flower, never a lost sub-agent.

And when the consumer's connection is lost, the dispatcher's is dropped without a word to the
broker before the consumer starts again. Celery's restart closes it politely (channel.close,
then connection.close, each waiting for its -ok): on a silent connection 2 x 10 s on the
consumer's thread, during which the new consumer connection sent no AMQP heartbeat and the
broker closed it too (seen: "Server unexpectedly closed connection" 20 s after each
reconnect). Celery makes a new dispatcher connection on every restart anyway.
"""

from __future__ import annotations

import contextlib
from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer

__all__ = ["Consumer"]


class Consumer(CeleryConsumer):
    def connection_for_write(self, url: str | None = None, heartbeat: Any = None) -> Any:
        # Celery's Events step is the consumer's one caller: its dispatcher's connection.
        return self.ensure_connected(self.app.connection_for_write(
            url=url, heartbeat=heartbeat, transport_options={"confirm_publish": False}))

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        dispatcher = self.event_dispatcher
        super().on_connection_error_after_connected(exc)
        if dispatcher is not None and dispatcher.connection is not None:
            with contextlib.suppress(Exception):  # closes its socket, sends nothing
                dispatcher.connection.collect()
