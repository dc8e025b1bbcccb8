"""A call no limit could ever admit is named before anything waits for it (workers/agent/fits):
the sizes, the limit, where the limit comes from and what to change."""

from __future__ import annotations

from drover.config import load_settings
from drover.workers.agent.fits import never_fits, spec_never_fits, unconfigured_scopes
from drover.workers.limiter import llm_scope, pool_scope

MODEL = "claude-sonnet-4-6"
OTHER = "claude-haiku-4-5"


def _settings(**overrides: object):  # noqa: ANN202
    return load_settings(**{"model": MODEL, "key_alias": "k", "itpm": 30_000, "otpm": 8_000,
                            **overrides})


def test_input_over_a_minute_of_the_configured_itpm_names_the_setting():
    s = _settings()
    assert never_fits(s, MODEL, input_tokens=30_000) is None
    why = never_fits(s, MODEL, input_tokens=30_001)
    assert why is not None and "about 30,001 input tokens (estimated)" in why
    assert f"{MODEL}'s input-token limit, 30,000 (DROVER_ITPM)" in why
    assert "raise the limit" in why


def test_a_model_of_its_own_entry_names_that_entry():
    s = _settings(limits={OTHER: {"rpm": 50, "itpm": 4_000}})
    why = never_fits(s, OTHER, input_tokens=5_000)
    assert why is not None and f"4,000 (DROVER_LIMITS[{OTHER!r}].itpm)" in why
    assert unconfigured_scopes(s, OTHER) == []
    # A model of no entry has no input-token limit configured: only a learned one can refuse.
    third = "claude-third"
    assert unconfigured_scopes(s, third) == [llm_scope("k", third)]
    assert never_fits(s, third, input_tokens=10**6) is None


def test_a_learned_limit_refuses_where_none_is_configured():
    s = _settings()
    scope = llm_scope("k", OTHER)
    learned = {scope: {"rpm": 50.0, "itpm": 20_000.0, "otpm": 2_000.0}}
    why = never_fits(s, OTHER, input_tokens=20_500, learned=learned)
    assert why is not None and ("20,000 (learned from the provider's "
                                "anthropic-ratelimit-input-tokens-limit header)") in why
    assert "raise the limit" not in why  # not drover's to raise
    assert never_fits(s, OTHER, input_tokens=19_000, learned=learned) is None
    # A configured limit wins over a learned one.
    assert never_fits(s, MODEL, input_tokens=25_000,
                      learned={llm_scope("k", MODEL): {"itpm": 20_000.0}}) is None


def test_a_pool_refuses_only_what_no_key_can_take():
    keys = [{"alias": "a", "api_key": "sk-a", "itpm": 20_000},
            {"alias": "b", "api_key": "sk-b", "itpm": 40_000}]
    s = _settings(itpm=100_000, keys=keys)
    assert never_fits(s, MODEL, input_tokens=39_000) is None  # key b can
    why = never_fits(s, MODEL, input_tokens=50_000)
    assert why is not None and "the largest pool key's" in why
    assert "40,000 (DROVER_KEYS[b].itpm)" in why
    assert "100,000" in (never_fits(s, MODEL, input_tokens=150_000) or "")
    # A key with no input-token limit of its own is held to the organisation's only.
    s = _settings(itpm=100_000, keys=[*keys, {"alias": "c", "api_key": "sk-c"}])
    assert never_fits(s, MODEL, input_tokens=50_000) is None
    learned = {pool_scope("c", MODEL): {"itpm": 30_000.0}}
    assert never_fits(s, MODEL, input_tokens=50_000, learned=learned)


def test_a_spec_shows_on_its_own_a_prefix_no_call_could_carry():
    s = _settings()
    assert spec_never_fits(s, MODEL, 1_000) is None
    why = spec_never_fits(s, MODEL, 31_000)
    assert why is not None and "system prompt and tool definitions alone are about 31,000" in why
    assert "every sub-agent's call would be refused" in why
    assert spec_never_fits(s, OTHER, 31_000) is None  # learned limits: the workers'
