"""A chord member counted while its Redis is paused (SIGSTOP: no FIN, no RST, as a hung host
or a failover looks) is counted once Redis answers, not raised into Celery's "Exception
raised outside body" warning with a traceback (``workers/tasklayer/_chord_count.py``). Real
Celery Redis backend, drover's app, a redis-server of the test's own."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from types import SimpleNamespace

from drover.config import Settings
from drover.config.celery import celery_config
from tests.helpers.private_redis import PrivateRedis

PAUSE_S = 8  # longer than redis-py's own retries of one command at a 2 s socket timeout


def test_a_member_counted_while_redis_is_paused_is_counted_when_it_answers(tmp_path, drover_env):
    # Imported here, under drover_env, not at collection: importing drover.workers.app
    # configures the test process's Celery app from the settings of that moment (the default
    # key prefix at collection, where no worker of the session listens).
    from drover.workers.tasklayer.app import DroverCelery

    server = PrivateRedis(tmp_path)
    server.start()
    try:
        settings = Settings(redis_url=server.url, key_prefix=f"t{uuid.uuid4().hex[:8]}",
                            socket_timeout_s=2, health_check_s=1)
        app = DroverCelery("chord-count", set_as_current=False)
        app.conf.update(celery_config(settings))
        backend = app.backend
        group = uuid.uuid4().hex
        backend.set_chord_size(group, 2)  # two members: counting one fires no callback
        request = SimpleNamespace(id=uuid.uuid4().hex, group=group, group_index=0,
                                  chord={"task": "never.called", "args": [], "kwargs": {},
                                         "options": {}, "subtask_type": None, "immutable": True})
        raised: list[BaseException] = []

        def count() -> None:
            try:
                backend.on_chord_part_return(request, "SUCCESS", None)
            except BaseException as error:  # noqa: BLE001 (the test reports it)
                raised.append(error)

        os.kill(server.proc.pid, signal.SIGSTOP)
        counting = threading.Thread(target=count, daemon=True)
        counting.start()
        time.sleep(PAUSE_S)  # the condition under test is Redis being away this long
        os.kill(server.proc.pid, signal.SIGCONT)
        counting.join(60)
        assert not counting.is_alive(), "the count did not come back within 60 s"
        assert not raised, raised
        assert backend.client.zcard(backend.get_key_for_group(group, ".j")) == 1
    finally:
        server.kill()
