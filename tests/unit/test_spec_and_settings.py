"""Bad input is refused with a message that says what to fix: job specs (before anything is
enqueued) and settings (at start-up, naming the variable, never showing the API key)."""

from __future__ import annotations

import json
import re

import pytest
from pydantic import ValidationError

from drover import JobSpec
from drover.config import SettingsError, load_settings


@pytest.mark.parametrize("spec, message", [
    ({"subtasks": []}, "subtasks is an empty list"),
    ({}, "needs subtasks"),
    ({"subtasks": ["a"], "goal": "b"}, "not both"),
    ({"subtasks": ["a"], "max_tokens": 0}, "greater than or equal to 1"),
    ({"subtasks": ["   "]}, "at least 1 character"),
    ({"subtasks": ["a"], "mode": "sometimes"}, "partial"),
    ({"subtasks": ["a"], "colour": "red"}, "not a JobSpec field"),
    ({"subtasks": ["a"], "max_tokens": 4000, "thinking": 4000}, "must be below max_tokens"),
    ({"subtasks": ["a"], "max_tokens": 4000, "thinking": 512}, "greater than or equal to 1024"),
])
def test_invalid_specs_are_refused_with_a_clear_message(spec, message):
    with pytest.raises(ValidationError, match=message):
        JobSpec.model_validate(spec)


@pytest.mark.parametrize("env, names", [
    ({"DROVER_RPM": "-5"}, ["DROVER_RPM"]),
    ({"DROVER_TARGET_UTILIZATION": "1.5"}, ["DROVER_TARGET_UTILIZATION"]),
    ({"DROVER_TARGET_UTILIZATION": "0"}, ["DROVER_TARGET_UTILIZATION"]),
    ({"DROVER_REDIS_URL": "localhost:6379"}, ["DROVER_REDIS_URL", "no scheme: write it as "
                                                "redis://localhost:6379"]),
    ({"DROVER_ANTHROPIC_BASE_URL": "ftp://x"}, ["DROVER_ANTHROPIC_BASE_URL", "http"]),
    ({"DROVER_VISIBILITY_TIMEOUT_S": "100"}, ["DROVER_VISIBILITY_TIMEOUT_S", "twice"]),
])
def test_invalid_settings_stop_start_up_naming_the_variable(monkeypatch, env, names):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    for name in names:
        assert name in str(caught.value)


def test_the_api_key_never_shows_in_settings_errors_or_reprs(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-very-secret")
    monkeypatch.setenv("DROVER_RPM", "-1")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert "very-secret" not in str(caught.value)
    monkeypatch.setenv("DROVER_RPM", "10")
    assert "very-secret" not in repr(load_settings())


@pytest.mark.parametrize("value, name", [
    ("{not json", "DROVER_LIMITS: not valid JSON"),
    ('{"claude-haiku-4-5": {"rpm": -1}}', "DROVER_LIMITS (claude-haiku-4-5.rpm)"),
    ('{"claude-haiku-4-5": {"rpn": 5}}', "DROVER_LIMITS (claude-haiku-4-5.rpn)"),
])
def test_bad_json_settings_name_the_variable_and_the_entry(monkeypatch, value, name):
    monkeypatch.setenv("DROVER_LIMITS", value)
    with pytest.raises(SettingsError, match=re.escape(name)):
        load_settings()


_ANT = {"alias": "ant", "api_key": "sk-a"}
_OAI = {"alias": "oai", "api_key": "sk-o", "provider": "openai"}
_GW = {"key": "dgw-test-0123456789abcdef", "tenant": "web"}  # a gateway key (a test value)


@pytest.mark.parametrize("env, says", [
    ({"DROVER_MODEL_PROVIDERS": '{"gpt-4o": "openai"}'},
     "without a pool the one key is DROVER_PROVIDER's (anthropic)"),
    ({"DROVER_MODEL_PROVIDERS": '{"gpt-4o": "openai"}', "DROVER_KEYS": json.dumps([_ANT])},
     "the models gpt-4o are on openai, but no key of DROVER_KEYS is"),
    ({"DROVER_KEYS": json.dumps([_ANT, _OAI])},
     "the key(s) oai are for openai, but no model is"),
    ({"DROVER_MODEL_PROVIDERS": '{"gpt-4o": "azure"}'}, "DROVER_MODEL_PROVIDERS"),
    ({"DROVER_KEYS": json.dumps([{**_OAI, "provider": "azure"}])}, "DROVER_KEYS"),
    ({"DROVER_PROVIDER": "openai", "DROVER_LIMITS": '{"gpt-4o": {"rpm": 5, "otpm": 9}}'},
     "DROVER_LIMITS['gpt-4o'] has an itpm or otpm, but it is on openai"),
    ({"DROVER_PROVIDER": "openai", "DROVER_LIMITS": '{"gpt-4o": {"itpm": 9}}'}, "give it as tpm"),
    ({"DROVER_LIMITS": '{"claude-haiku-4-5": {"tpm": 9}}'},
     "has a tpm, but it is on anthropic, which counts input and output tokens apart"),
    ({"DROVER_MODEL_PROVIDERS": '{"gpt-4o": "openai"}',
      "DROVER_KEYS": json.dumps([_ANT, {**_OAI, "itpm": 9}])},
     "DROVER_KEYS[oai] has an itpm or otpm, but it is on openai"),
    ({"DROVER_GATEWAY_KEYS": json.dumps([{**_GW, "tpm": 9}])},
     "DROVER_GATEWAY_KEYS: the key of tenant web has a tpm, but it is on anthropic"),
    ({"DROVER_PROVIDER": "openai", "DROVER_GATEWAY_KEYS": json.dumps([{**_GW, "otpm": 9}])},
     "DROVER_GATEWAY_KEYS: the key of tenant web has an itpm or otpm, but it is on openai"),
    ({"DROVER_GATEWAY_KEYS": json.dumps([{**_GW, "rpm": 0}])}, "DROVER_GATEWAY_KEYS (0.rpm)"),
    ({"DROVER_GATEWAY_KEYS": json.dumps([{**_GW, "rpn": 5}])}, "DROVER_GATEWAY_KEYS (0.rpn)"),
])
def test_providers_of_models_and_keys_are_checked_at_start_up(monkeypatch, env, says):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SettingsError, match=re.escape(says)):
        load_settings()


def test_a_model_picks_its_providers_keys(monkeypatch):
    monkeypatch.setenv("DROVER_KEYS", json.dumps([_ANT, {**_OAI, "rpm": 10}]))
    monkeypatch.setenv("DROVER_MODEL_PROVIDERS", '{"gpt-4o": "openai"}')
    s = load_settings()
    assert s.provider_of("gpt-4o") == "openai" and s.provider_of(s.model) == "anthropic"
    assert [s.key_provider(k) for k in s.keys] == ["anthropic", "openai"]
    # A key's limits apply to its own provider's models only.
    assert s.key_limits_for(s.keys[1], s.model) is None


def test_tool_modules_take_a_json_list_or_comma_separated_names(monkeypatch):
    monkeypatch.setenv("DROVER_TOOL_MODULES", "drover.workers.tools.demo, my_tools")
    assert load_settings().tool_modules == ["drover.workers.tools.demo", "my_tools"]
    monkeypatch.setenv("DROVER_TOOL_MODULES", '["drover.workers.tools.demo"]')
    assert load_settings().tool_modules == ["drover.workers.tools.demo"]


def test_only_drover_variables_that_no_code_reads_are_reported_as_unknown():
    from drover.config.docs import _OTHERS
    from drover.config.settings import READ_ELSEWHERE, unknown_variables

    assert {name for name, _, _ in _OTHERS} <= READ_ELSEWHERE
    read = {"DROVER_RPM": "1", "DROVER_ANTHROPIC_API_KEY": "k", "ANTHROPIC_API_KEY": "k",
            "_DROVER_WORKER_CHECKED": "1", **dict.fromkeys(READ_ELSEWHERE, "x")}
    assert unknown_variables(read, env_file=None) == []
    assert unknown_variables({"drover_itpmm": "1", "DROVER_ZZZZZZ": "1"}, env_file=None) == [
        "DROVER_ITPMM is not a drover setting; did you mean DROVER_ITPM?",
        "DROVER_ZZZZZZ is not a drover setting (docs/settings.md lists them)"]


def test_a_workers_start_lines_name_each_limits_source_and_never_a_key():
    from drover.config import load_settings
    from drover.workers.tasklayer.startup import start_lines

    class NoRedis:  # the lines' learned part reads Redis; without it they say "unknown"
        def state(self, scope):
            raise ConnectionError

        def scopes(self):
            raise ConnectionError

    settings = load_settings(
        rpm=100, limits={"claude-haiku-4-5": {"rpm": 50}},
        keys=[{"alias": "eu", "api_key": "sk-secret-eu", "rpm": 10,
               "base_url": "http://u:pw@proxy:8080"}])
    text = "\n".join(start_lines(settings, NoRedis()))
    assert "limits of pool/llm:org:claude-sonnet-4-6: rpm 100 (DROVER_RPM), itpm 30,000 " \
           "(drover default)" in text.replace("{", "").replace("}", ""), text
    assert "rpm 50 (DROVER_LIMITS), itpm unknown until a response's -limit headers" in text
    assert "rpm 10 (DROVER_KEYS)" in text and "http://u:***@proxy:8080" in text
    assert "sk-secret-eu" not in text and "pw@" not in text


def test_an_unknown_tool_says_how_tools_are_made_and_which_one_was_meant():
    from drover.workers.tools import demo as demo_tools  # noqa: F401  (registers calculator, ...)
    from drover.workers.tools import get_tools

    with pytest.raises(ValueError) as raised:
        get_tools(["calculater", "zzz"])
    said = str(raised.value)
    assert "calculater (did you mean calculator?)" in said and "zzz;" in said, said
    assert "from drover import tool" in said and "DROVER_TOOL_MODULES" in said


def test_every_drover_variable_the_code_reads_is_a_setting_or_known_elsewhere():
    """A variable read with os.environ / getenv outside Settings would be reported as a
    typo at every start: it belongs in READ_ELSEWHERE (or, better, in Settings)."""
    import re

    from drover.config.settings import READ_ELSEWHERE, setting_names
    from tests.helpers import ROOT

    read = set()
    for path in ROOT.rglob("*.py"):
        if any(part in (".git", "node_modules") or part.startswith(".venv")
               for part in path.parts):
            continue
        read |= set(re.findall(r"""(?:environ(?:\.get)?[\[(]|getenv\()\s*["'](DROVER_\w+)""",
                               path.read_text(errors="replace")))
    assert read, "the scan found no read at all"
    assert read <= setting_names() | READ_ELSEWHERE, sorted(read - setting_names()
                                                            - READ_ELSEWHERE)


def test_a_worker_on_openai_names_its_own_endpoint_and_no_claude_limits(monkeypatch, tmp_path):
    from drover.config import load_settings
    from drover.workers.tasklayer.startup import start_lines

    # The endpoints come from the environment as a user sets them (OPENAI_BASE_URL), and
    # nothing else of this process's environment or working folder (a .env) names one. Passed
    # as load_settings(openai_base_url=...), a field read through an alias was dropped by
    # pydantic-settings 2.14 (the version CI's interpreter has; 2.16 case-folds it to the
    # alias), and the line read "OPENAI_BASE_URL unset".
    monkeypatch.chdir(tmp_path)
    for name in ("OPENAI_BASE_URL", "DROVER_OPENAI_BASE_URL", "ANTHROPIC_BASE_URL",
                 "DROVER_ANTHROPIC_BASE_URL", "DROVER_PROVIDER", "DROVER_MODEL", "DROVER_KEYS",
                 "DROVER_MODEL_PROVIDERS"):
        monkeypatch.delenv(name, raising=False)

    class NoRedis:
        def state(self, scope):
            raise ConnectionError

        def scopes(self):
            raise ConnectionError

    monkeypatch.setenv("OPENAI_BASE_URL", "http://u:pw@llm.internal/v1")
    settings = load_settings(provider="openai")
    assert settings.openai_base_url == "http://u:pw@llm.internal/v1"
    monkeypatch.delenv("OPENAI_BASE_URL")
    text = "\n".join(start_lines(settings, NoRedis()))
    assert "provider endpoint http://u:***@llm.internal/v1 (openai)" in text, text
    assert "Anthropic API" not in text and "limits of llm:default:claude" not in text, text
    assert "default model: none for openai (DROVER_MODEL unset" in text, text
    named = load_settings(provider="openai", model="gpt-4o", rpm=500, tpm=90_000)
    text = "\n".join(start_lines(named, NoRedis()))
    assert "limits of llm:default:gpt-4o: rpm 500 (DROVER_RPM), tpm 90,000 (DROVER_TPM)" in text
    assert "the OpenAI API (the SDK's default; OPENAI_BASE_URL unset)" in text, text
    both = load_settings(model_providers={"gpt-4o": "openai"}, keys=[
        {"alias": "a", "api_key": "sk-a"}, {"alias": "o", "api_key": "sk-o", "provider": "openai"}])
    text = "\n".join(start_lines(both, NoRedis()))
    assert "provider endpoints the Anthropic API" in text and "; the OpenAI API" in text, text


@pytest.mark.parametrize("spec", [
    JobSpec(subtasks=["a", "b"], max_tokens=60),
    JobSpec(goal="plan a trip"),
])
def test_a_spec_dumped_whole_loads_as_itself(spec):
    # drover submit reads a spec written out with every field (model_dump_json): the default
    # empty inputs of a subtasks job are no request for a job of one's own sub-agent.
    assert JobSpec.model_validate_json(spec.model_dump_json()) == spec
