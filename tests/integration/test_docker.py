"""docker-compose.yml and the Dockerfile, checked without Docker (it cannot run on the CI
machines): the compose file's structure, and every service's command run here with --help,
which proves its entry point exists and takes the arguments the file gives it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
import tomllib
from typing import Any

import pytest

from tests.helpers import ROOT
from tests.helpers.ports import free_port

yaml = pytest.importorskip("yaml", reason="PyYAML parses docker-compose.yml in this test")

SERVICES = {"redis", "simulator", "worker", "flower", "metrics", "prometheus", "grafana",
            "orchestrator", "gateway"}
DROVER_SERVICES = SERVICES - {"redis", "prometheus", "grafana"}  # test_metrics checks those two


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _flag(command: list[str], name: str) -> str:
    for i, arg in enumerate(command):
        if arg == name:
            return command[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{name} not in {command}")


def _deps(service: dict[str, Any]) -> dict[str, str]:
    deps = service.get("depends_on", {})
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: spec.get("condition", "service_started") for name, spec in deps.items()}


def test_compose_has_every_service_built_from_the_one_image(compose):
    services = compose["services"]
    assert set(services) == SERVICES
    for name in DROVER_SERVICES:
        assert services[name]["build"] == "." and services[name]["image"] == "drover:local"
        assert services[name]["command"][0] == "drover"
    assert services["redis"]["image"].startswith("redis:")


def test_worker_scales_with_the_scale_flag(compose):
    worker = compose["services"]["worker"]
    # --scale worker=N fails with a fixed container name or host port
    assert "container_name" not in worker and "ports" not in worker and "hostname" not in worker
    assert worker["command"][:2] == ["drover", "worker"]
    assert _deps(worker) == {"redis": "service_healthy", "simulator": "service_healthy"}
    # each replica must be its own Celery node: the default celery@<container hostname>
    assert "-n" not in worker["command"] and "--hostname" not in worker["command"]


def test_flower_takes_basic_auth_from_the_environment(compose):
    flower = compose["services"]["flower"]
    assert _flag(flower["command"], "--address") == "0.0.0.0"  # so drover insists on auth
    auth = flower["environment"]["DROVER_FLOWER_BASIC_AUTH"]
    assert re.fullmatch(r"\$\{DROVER_FLOWER_BASIC_AUTH:\?[^}]+\}", auth), auth
    assert not any("basic" in arg for arg in flower["command"])  # never on a command line
    assert flower["ports"] == ["${DROVER_FLOWER_PORT:-5555}:5555"]


def test_the_gateway_takes_its_callers_keys_from_the_environment_and_the_shared_limits(
        compose):
    """The gateway runs with its profile (it needs its callers' keys, which only the operator
    has), on the fleet's Redis and limits; the keys are never on its command line."""
    gateway = compose["services"]["gateway"]
    assert gateway["profiles"] == ["gateway"]
    assert gateway["command"][:2] == ["drover", "gateway"]
    assert _flag(gateway["command"], "--addr") == "0.0.0.0"
    env = gateway["environment"]
    assert re.fullmatch(r"\$\{DROVER_GATEWAY_KEYS:\?[^}]+\}", env["DROVER_GATEWAY_KEYS"])
    assert not any("dgw-" in arg or "KEYS" in arg for arg in gateway["command"])
    worker = compose["services"]["worker"]["environment"]
    for name in ("DROVER_REDIS_URL", "DROVER_ANTHROPIC_BASE_URL", "DROVER_RPM", "DROVER_ITPM",
                 "DROVER_OTPM"):
        assert env[name] == worker[name], name
    port = _flag(gateway["command"], "--port")
    assert gateway["ports"] == [f"${{DROVER_GATEWAY_PORT:-8090}}:{port}"]
    assert _deps(gateway) == {"redis": "service_healthy", "simulator": "service_healthy"}


def test_services_wait_for_healthy_dependencies(compose):
    services = compose["services"]
    for name in SERVICES - {"orchestrator"}:
        assert services[name]["healthcheck"]["test"], name
    orchestrator = services["orchestrator"]
    assert _deps(orchestrator) == {"simulator": "service_healthy", "worker": "service_healthy"}
    assert orchestrator["restart"] == "no"
    assert orchestrator["command"][:3] == ["drover", "demo", "--on-services"]


def test_services_point_at_each_other_and_share_the_simulated_limits(compose):
    services = compose["services"]
    sim = services["simulator"]["command"]
    assert _flag(sim, "--host") == "0.0.0.0"
    for name in ("worker", "flower", "orchestrator"):
        env = services[name]["environment"]
        assert env["DROVER_REDIS_URL"] == "redis://redis:6379/0"
        assert env["DROVER_ANTHROPIC_BASE_URL"] == f"http://simulator:{_flag(sim, '--port')}"
        # the limiter's limits are the simulated provider's
        for dim in ("rpm", "itpm", "otpm"):
            assert float(env[f"DROVER_{dim.upper()}"]) == float(_flag(sim, f"--{dim}")), dim


def _local(command: list[str]) -> list[str]:
    """A compose command as this checkout runs it: `drover` is orchestrator.cli's main."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["drover"] == "drover.orchestrator.cli:main"
    if command[0] == "drover":
        return [sys.executable, "-m", "drover.orchestrator.cli", *command[1:]]
    return command


@pytest.mark.parametrize("service", sorted(DROVER_SERVICES))
def test_each_service_command_exists_here_and_takes_its_arguments(compose, service):
    command = compose["services"][service]["command"]
    out = subprocess.run([*_local(command), "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"usage|Usage", out.stdout + out.stderr)


def test_redis_service_command_starts_a_redis_that_keeps_its_data(compose, tmp_path):
    """redis-server has no --help after other options: start it with the file's arguments."""
    command = compose["services"]["redis"]["command"]
    if shutil.which(command[0]) is None:
        pytest.skip(f"{command[0]} is not installed here")
    import redis

    port = free_port()
    # Its data directory (a volume in the container) becomes a temporary one here.
    command = [str(tmp_path) if before == "--dir" else arg
               for before, arg in zip(["", *command], command, strict=False)]
    proc = subprocess.Popen([*command, "--port", str(port), "--bind", "127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(port=port, socket_connect_timeout=1)
        for _ in range(100):
            try:
                assert client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.1)
        assert client.config_get("save") == {"save": ""}
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_worker_healthcheck_command_exists():
    out = subprocess.run([sys.executable, "-m", "celery", "-A", "drover.workers.app", "inspect",
                          "ping", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--destination" in out.stdout, out.stderr


def test_dockerfile_is_slim_non_root_and_ships_only_the_runtime():
    text = (ROOT / "Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip()
             and not line.lstrip().startswith("#")]
    assert lines[0] == "FROM python:3.11-slim"
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    last_user = max(i for i, line in enumerate(lines) if line.startswith("USER "))
    assert not any(line.startswith(("RUN pip", "RUN apt")) for line in lines[last_user:])
    copied = {line.split()[1] for line in lines if line.startswith("COPY ")}
    assert copied == {"pyproject.toml", "__init__.py", "config", "workers", "orchestrator",
                      "simulator"}
    for path in copied:
        assert (ROOT / path).exists(), path
    # test and benchmark extras are not installed; the demo extra is (the orchestrator's plot)
    assert "[test]" not in text and "['test']" not in text and "['bench']" not in text
    assert "['optional-dependencies']['demo']" in text
    ignored = (ROOT / ".dockerignore").read_text().split()
    for path in ("tests", "bench", ".git", "docs"):
        assert path in ignored, path


def test_the_image_installs_every_runtime_package_and_its_lua():
    """`pip install .` installs one root package, `drover`, with every package folder of the
    four rooms under it (pyproject.toml lists them: a folder left out would not install)."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert tool["package-dir"] == {"drover": "."}
    listed = set(tool["packages"])
    folders = {"drover"} | {
        "drover." + ".".join(init.parent.relative_to(ROOT).parts)
        for room in ("config", "workers", "orchestrator", "simulator")
        for init in (ROOT / room).rglob("__init__.py")}
    assert listed == folders, (listed ^ folders)
    for package in listed:
        lua = ROOT.joinpath(*package.split(".")[1:], "lua")
        if lua.is_dir():
            assert tool["package-data"][package] == ["lua/*.lua"], package
    assert (ROOT / "workers" / "limiter" / "lua" / "acquire.lua").exists()
