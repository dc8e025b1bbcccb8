"""A runtime whose event loop is stuck still goes: its close says where the loop's thread
stood and stops the loop instead of raising. (A close that raised left ``reset_runtime()``
holding the stuck runtime, so every later close timed out again: one CI run turned a single
stuck loop into 144 errors.)"""

from __future__ import annotations

import logging
import threading

from drover.config import load_settings
from drover.workers.agent.runtime import Runtime
from drover.workers.services import Services


def test_a_runtime_with_a_blocked_loop_closes_and_names_where_it_was_stuck(
        redis_url, key_prefix, caplog):  # noqa: ANN001
    rt = Runtime(Services(load_settings(redis_url=redis_url, key_prefix=key_prefix)))
    release = threading.Event()

    async def blocks_the_loop() -> None:
        release.wait(30)  # a blocking call on the loop: nothing else on it runs

    rt.submit(blocks_the_loop())
    try:
        with caplog.at_level(logging.WARNING, "drover.workers.agent.runtime"):
            rt.close(timeout_s=0.5)
    finally:
        release.set()
    (message,) = [r.getMessage() for r in caplog.records]
    assert "did not shut down within 0.5 s" in message and "blocks_the_loop" in message
    rt._thread.join(5)
    assert not rt._thread.is_alive(), "the loop was stopped once it let go"
