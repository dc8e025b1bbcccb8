"""DROVER_KEYS entries of Claude on Amazon Bedrock and Google Vertex AI: what each takes, and a
clear one-line error naming what to fix (never a secret) for what it does not."""

from __future__ import annotations

import json

import pytest

from drover.config import SettingsError, load_settings
from drover.workers.agent.routes import Route
from drover.workers.providers import Pool

SECRET = "very-secret-credential"
BEDROCK = {"alias": "bed", "provider": "bedrock", "region": "us-east-1", "rpm": 100,
           "tpm": 200_000}
VERTEX = {"alias": "vtx", "provider": "vertex", "region": "us-east5", "project": "p",
          "rpm": 100, "itpm": 100_000, "otpm": 20_000}


def test_a_pool_of_the_api_bedrock_and_vertex_serves_claude(monkeypatch):
    monkeypatch.setenv("DROVER_KEYS", json.dumps([
        {"alias": "api", "api_key": SECRET, "rpm": 50},
        {**BEDROCK, "api_key": SECRET, "models": {"claude-sonnet-4-6": "anthropic.x-v1:0"}},
        {**VERTEX, "access_token": SECRET}]))
    s = load_settings(model="claude-sonnet-4-6", rpm=60)
    assert [s.key_serves(k) for k in s.keys] == ["anthropic"] * 3
    assert [k.cloud for k in s.keys] == [False, True, True]
    assert s.keys[1].cloud_model("claude-sonnet-4-6") == "anthropic.x-v1:0"
    assert s.keys[1].cloud_model("claude-haiku-4-5") == "claude-haiku-4-5"  # passes through
    route = Route(s, "claude-sonnet-4-6", None, Pool(s.keys, dict.fromkeys(
        ("api", "bed", "vtx"))))
    limits = {k.alias: k.limits for k in route.keys}
    assert not limits["api"].alone and limits["bed"].alone and limits["vtx"].alone
    assert limits["bed"].output_weight == 5 and limits["bed"].tpm == pytest.approx(
        200_000 * s.target_utilization)
    assert [k.provider.name for k in route.keys] == ["anthropic", "bedrock", "vertex"]
    assert SECRET not in repr(s) and SECRET not in str(s.keys)


@pytest.mark.parametrize("entry, says", [
    ({**BEDROCK, "region": None}, 'needs "region" (a bedrock entry)'),
    ({**VERTEX, "project": None}, 'needs "project" (a vertex entry)'),
    ({**BEDROCK, "itpm": 5}, "on bedrock, whose limit is one tokens quota"),
    ({**VERTEX, "tpm": 5}, "on vertex, which counts input and output tokens apart"),
    ({**VERTEX, "api_key": SECRET}, 'has "api_key", which only anthropic or openai or bedrock'),
    ({**BEDROCK, "access_token": SECRET}, 'has "access_token", which only vertex'),
    ({"alias": "a", "api_key": SECRET, "region": "eu"}, 'has "region", which only bedrock or '
                                                         "vertex"),
    ({"alias": "a"}, 'needs "api_key"'),
    ({"alias": "bed", "provider": "bedrock", "region": "r", "api_key": SECRET},
     "bedrock sends no rate-limit headers to learn them from; give its quotas as rpm and tpm"),
    ({**BEDROCK, "output_burndown": 0.5}, "output_burndown"),
    ({**BEDROCK, "provider": "azure"}, "provider"),
])
def test_a_bad_cloud_entry_says_what_to_fix_in_one_line(monkeypatch, entry, says):
    monkeypatch.setenv("DROVER_KEYS", json.dumps([{k: v for k, v in entry.items()
                                                   if v is not None}]))
    with pytest.raises(SettingsError) as info:
        load_settings(model="claude-sonnet-4-6")
    message = str(info.value)
    assert says in message and SECRET not in message, message
    assert len(message.splitlines()) == 2, message  # the heading and one line


def test_a_cloud_entry_serves_claude_not_openai(monkeypatch):
    monkeypatch.setenv("DROVER_KEYS", json.dumps([BEDROCK]))
    with pytest.raises(SettingsError) as info:
        load_settings(provider="openai", model="gpt-4.1", tpm=1000)
    assert "on openai, but no key of DROVER_KEYS is" in str(info.value)


def test_the_cloud_pages_settings_load_as_written(monkeypatch):
    """docs/bedrock.md's and docs/vertex.md's DROVER_KEYS blocks are settings that load."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    found = 0
    for page in ("bedrock.md", "vertex.md"):
        text = (root / "docs" / page).read_text()
        for keys in re.findall(r"DROVER_KEYS='(\[.*?\])'", text, re.DOTALL):
            monkeypatch.setenv("DROVER_KEYS", keys)
            s = load_settings(model="claude-sonnet-4-5")
            assert all(s.key_serves(k) == "anthropic" for k in s.keys)
            found += 1
    assert found >= 4


def test_a_worker_on_a_pool_of_clouds_alone_needs_no_anthropic_api_key(monkeypatch):
    from drover.workers.connections.preflight import check_worker, has_credentials

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("DROVER_ANTHROPIC_BASE_URL", raising=False)
    monkeypatch.setenv("DROVER_KEYS", json.dumps([BEDROCK, {**VERTEX, "access_token": SECRET}]))
    s = load_settings(model="claude-sonnet-4-6", anthropic_api_key=None)
    assert has_credentials(s)
    check_worker(s, services=False)  # the entries carry their own credentials


def test_the_gateway_scrubs_every_entrys_credentials_from_what_a_caller_gets(monkeypatch):
    """A cloud entry serves the gateway's calls too: its Bedrock API key and its Vertex AI
    access token are scrubbed from an answer as the Anthropic API's keys are."""
    from types import SimpleNamespace

    from drover.orchestrator.gateway._forward import Forwarder

    monkeypatch.setenv("DROVER_KEYS", json.dumps([
        {"alias": "api", "api_key": "sk-api-credential", "rpm": 50},
        {**BEDROCK, "api_key": "bedrock-credential"},
        {**VERTEX, "access_token": "vertex-credential"}]))
    s = load_settings(model="claude-sonnet-4-6", rpm=60)
    said = Forwarder(SimpleNamespace(settings=s), "anthropic").scrub(
        b"keys sk-api-credential, bedrock-credential and vertex-credential")
    assert said == b"keys ***, *** and ***"
