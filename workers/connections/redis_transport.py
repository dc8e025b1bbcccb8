"""kombu's Redis transport with silence-aware connections (the Celery broker's on a plain
``redis://`` URL; ``sentinel_transport`` is the Sentinel list's).

Its connections give up on themselves once one of them timed out (``silence.py``): after a
silence the Celery consumer waits out one socket timeout, not one per connection of its
channel's pools. Selected by ``broker_transport`` in ``drover.config.celery``.
"""

from __future__ import annotations

from kombu.transport.redis import Channel as RedisChannel
from kombu.transport.redis import Transport as RedisTransport

from drover.workers.connections.silence import SilenceAwareConnection

__all__ = ["Channel", "Transport"]


class Channel(RedisChannel):
    connection_class = SilenceAwareConnection


class Transport(RedisTransport):
    Channel = Channel
