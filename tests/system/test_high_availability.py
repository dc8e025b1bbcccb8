"""Redis that fails over, the configuration half: a Sentinel list in DROVER_REDIS_URL with
DROVER_SENTINEL_MASTER, Celery's broker and result backend following it, one client factory
for every Redis client, a clear exit 3 for a wrong master name or no sentinel answering, and
the eviction check at worker start (docs/high-availability.md)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile

import pytest
import redis

from drover.config import SettingsError, load_settings
from drover.config.celery import celery_config
from drover.workers.connections.preflight import check_services, eviction_problem, redis_problem
from drover.workers.connections.redis_clients import sync_redis
from tests.helpers.cli import BOUND_S, clean_env, drover
from tests.helpers.ports import free_port


@pytest.fixture
def spec_file(tmp_path):
    path = tmp_path / "job.json"
    path.write_text('{"subtasks": ["Summarise vendor A"], "max_tokens": 64}')
    return path


def test_a_sentinel_list_needs_the_master_name_and_says_which_setting():
    url = "sentinel://127.0.0.1:26379;sentinel://127.0.0.1:26380"
    with pytest.raises(SettingsError) as raised:
        load_settings(redis_url=url)
    assert "DROVER_SENTINEL_MASTER" in str(raised.value)
    settings = load_settings(redis_url=url, sentinel_master="mymaster")
    assert settings.broker == settings.backend == url


@pytest.mark.parametrize("url, says", [
    ("sentinel://127.0.0.1:26379;redis://127.0.0.1:6379", "is not sentinel://HOST:PORT"),
    ("sentinel://127.0.0.1:notaport", "not a number"),
    ("sentinel://:pw@127.0.0.1:26379/x", "is not a number"),
])
def test_a_malformed_sentinel_list_is_refused_at_settings_time(url, says):
    with pytest.raises(SettingsError) as raised:
        load_settings(redis_url=url, sentinel_master="m")
    assert says in str(raised.value) and "DROVER_REDIS_URL" in str(raised.value)
    assert ":pw@" not in str(raised.value)


def test_celerys_broker_and_result_backend_follow_the_sentinel_list():
    url = "sentinel://:secret@127.0.0.1:26379/2;sentinel://127.0.0.1:26380/2"
    settings = load_settings(redis_url=url, sentinel_master="mymaster",
                             sentinel_password="sentinel-secret")
    config = celery_config(settings)
    assert config["broker_url"] == config["result_backend"] == url
    # kombu's Sentinel transport with drover's connection (connections/sentinel_transport.py)
    assert config["broker_transport"] == "drover.workers.connections.sentinel_transport:Transport"
    for options in (config["broker_transport_options"],
                    config["result_backend_transport_options"]):
        assert options["master_name"] == "mymaster"
        assert options["sentinel_kwargs"]["password"] == "sentinel-secret"
    apart = celery_config(load_settings(redis_url=url, sentinel_master="mymaster",
                                        broker_url="amqp://guest:guest@127.0.0.1:5672//"))
    assert "master_name" not in apart["broker_transport_options"]
    assert "broker_transport" not in apart
    assert apart["result_backend_transport_options"]["master_name"] == "mymaster"


def test_every_client_reaches_the_master_through_the_sentinels(sentinel_set):
    client = sync_redis(sentinel_set.url, master=sentinel_set.master_name)
    client.set("ha-probe", "1")
    assert client.connection_pool.connection_kwargs["retry"] is not None
    master = sentinel_set.client(sentinel_set.master_port())
    assert master.get("ha-probe") == b"1"
    settings = load_settings(redis_url=sentinel_set.url, sentinel_master=sentinel_set.master_name)
    check_services(settings)  # the broker and the backend are the same list


def test_a_wrong_master_name_and_dead_sentinels_are_told_apart(sentinel_set):
    problem = redis_problem(sentinel_set.url, master="nosuchmaster")
    assert "no sentinel knows a master named 'nosuchmaster' (DROVER_SENTINEL_MASTER)" in problem
    assert sentinel_set.master_name in problem  # what they do monitor
    dead = f"sentinel://127.0.0.1:{free_port()};sentinel://127.0.0.1:{free_port()}"
    assert redis_problem(dead, master="m", timeout=1).startswith("no sentinel answered")
    # the first sentinel listed dead, the next one answers (celery#5538)
    first_dead = f"sentinel://127.0.0.1:{free_port()};{sentinel_set.url}"
    assert redis_problem(first_dead, master=sentinel_set.master_name) is None


def test_the_cli_and_the_worker_exit_3_naming_the_setting(sentinel_set, tmp_path, spec_file):
    env = clean_env(DROVER_REDIS_URL=sentinel_set.url, DROVER_SENTINEL_MASTER="nosuchmaster",
                    ANTHROPIC_API_KEY="sk-x")
    for args in (["submit", str(spec_file)], ["worker"]):
        proc = drover(args, env, tmp_path)
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert "DROVER_SENTINEL_MASTER" in proc.stderr, proc.stderr
    dead = f"sentinel://127.0.0.1:{free_port()}"
    proc = drover(["worker"], clean_env(DROVER_REDIS_URL=dead, DROVER_SENTINEL_MASTER="m",
                                        ANTHROPIC_API_KEY="sk-x"), tmp_path)
    assert proc.returncode == 3 and "no sentinel answered" in proc.stderr, proc.stderr


# --- eviction ---------------------------------------------------------------------------------

@pytest.fixture
def own_redis():
    """A redis-server of the test's own, so its maxmemory-policy can be set freely."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not on PATH (Debian: apt-get install redis-server)")
    port, workdir = free_port(), tempfile.mkdtemp(prefix="drover-evict-")
    proc = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(port),
                             "--save", "", "--appendonly", "no", "--dir", workdir],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    for _ in range(100):
        with contextlib.suppress(redis.ConnectionError):
            client.ping()
            break
        proc.poll()
        subprocess.run(["sleep", "0.1"])
    yield f"redis://127.0.0.1:{port}/0", client
    proc.terminate()
    proc.wait()
    shutil.rmtree(workdir, ignore_errors=True)


def test_a_redis_that_may_evict_any_key_is_refused_and_volatile_is_warned(own_redis, tmp_path):
    url, client = own_redis
    settings = load_settings(redis_url=url)
    assert eviction_problem(settings) is None  # noeviction, the default
    client.config_set("maxmemory-policy", "volatile-lru")
    kind, message = eviction_problem(settings)
    assert kind == "warn" and "volatile-lru" in message and "noeviction" in message
    client.config_set("maxmemory-policy", "allkeys-lru")
    kind, message = eviction_problem(settings)
    assert kind == "refuse" and "noeviction" in message and "Redis of its own" in message
    env = clean_env(DROVER_REDIS_URL=url, ANTHROPIC_API_KEY="sk-x")
    proc = drover(["worker"], env, tmp_path)
    assert proc.returncode == 3 and "allkeys-lru" in proc.stderr, proc.stderr
    celery = subprocess.run([sys.executable, "-m", "celery", "-A", "drover.workers.app",
                             "worker"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=BOUND_S)
    assert celery.returncode == 3 and "allkeys-lru" in celery.stderr, celery.stderr
    assert "Traceback" not in celery.stdout + celery.stderr
