"""kombu's Sentinel transport with drover's Sentinel connection (the Celery broker's).

kombu's ``SentinelChannel`` connects through redis-py's ``SentinelManagedConnection``, which
asks the sentinels for the master only when a pool hands a connection out. The worker's
consumer keeps its BRPOP connection for good and reconnects it in place, so after a failover
it went back to the dead master for ever: no error, no log line, the queue filling up on the
new master (reproduced with a SIGKILLed master; celery#6348). ``SentinelConnection`` asks on
every connect.

And no retries inside redis-py: since redis-py 6 a connection retries three times by itself,
so when the master died under the consumer's pub/sub connection (the fan-out and pidbox
subscription), redis-py reconnected it to the new master inside the read and then waited
there for a message, with no timeout, blocking the worker's event loop (seen in a stack
dump: ``_receive_one`` -> ``parse_response`` -> ``_read_from_socket``). kombu is written for
errors that reach it: it drops the connection and Celery's consumer starts again
("Connection to broker lost"), through the sentinels, with its own retry policy. Selected by
``broker_transport`` in ``drover.config.celery`` whenever the broker URL is a Sentinel list.
"""

from __future__ import annotations

from typing import Any

from kombu.transport.redis import SentinelChannel, SentinelTransport
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

from drover.workers.connections.redis_clients import SentinelConnection

__all__ = ["Channel", "Transport"]


class Channel(SentinelChannel):
    connection_class = SentinelConnection

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        if self.connection.client is None:
            # The connection was closed (kombu's Connection._close drops the transport's
            # client) while a channel of it still made its pool, an ack or the pub/sub after
            # a failover: kombu's AttributeError there was Celery's "Unrecoverable error", and
            # the worker exited (both workers of a failover test beside a CPU hog). A
            # connection error is what Celery reconnects from.
            raise RedisConnectionError("the broker connection was closed (a failover under way)")
        params = super()._connparams(asynchronous)
        params["retry"] = Retry(NoBackoff(), 0)  # errors reach kombu: see the docstring
        return params


class Transport(SentinelTransport):
    Channel = Channel
