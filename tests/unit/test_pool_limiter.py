"""A pool of keys inside one organisation's limits, below the workers: the settings, the
nested acquire (real Redis, an injected clock), header attribution and nested cooldowns."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis
import redis.asyncio as aredis
from redis.cluster import key_slot

from drover.config import SettingsError, load_settings
from drover.workers.agent.routes import Route, levels_of_429, split_readings
from drover.workers.limiter import AsyncLimiter, Limiter, ScopeLimits, org_scope, pool_scope
from drover.workers.providers import ANTHROPIC, Pool

SECRET = "sk-ant-very-secret-value"


def _keys(*entries: dict) -> str:
    return json.dumps([{"api_key": f"{SECRET}-{i}", **e} for i, e in enumerate(entries)])


# --- settings ----------------------------------------------------------------------------------

def test_keys_parse_with_their_own_limits_and_the_org_limits_keep_their_meaning(monkeypatch):
    monkeypatch.setenv("DROVER_KEYS", _keys({"alias": "a", "rpm": 10},
                                            {"alias": "b", "limits": {"m2": {"itpm": 500}}}))
    s = load_settings(model="m1", rpm=100)
    assert s.pooled and [k.alias for k in s.keys] == ["a", "b"]
    assert s.limits_for("m1").rpm == 100  # the organisation's
    assert s.key_limits_for(s.keys[0], "m1").rpm == 10
    assert s.key_limits_for(s.keys[1], "m1") is None  # only the organisation's
    assert s.key_limits_for(s.keys[1], "m2").itpm == 500
    assert SECRET not in repr(s) and SECRET not in str(s.keys)


def test_one_key_and_no_pool_changes_nothing():
    s = load_settings(model="m1")
    assert not s.pooled and s.limit_class("m1") == "m1"
    assert Route(s, "m1", client=None).scope == f"llm:{s.key_alias}:m1"


@pytest.mark.parametrize("value, says", [
    (f'["{SECRET}"]', "DROVER_KEYS"),
    (_keys({"alias": "org"}), "names the organisation"),
    (_keys({"alias": "a"}, {"alias": "a"}), "more than once"),
    (_keys({"alias": "a", "rmp": 5}), "rmp"),
])
def test_a_bad_pool_says_what_to_fix_and_never_echoes_a_key(monkeypatch, value, says):
    monkeypatch.setenv("DROVER_KEYS", value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert says in str(info.value) and SECRET not in str(info.value)


def test_two_models_of_one_class_share_one_scope(monkeypatch):
    s = load_settings(model="m1", limit_groups={"fam": ["m1", "m2"]})
    assert s.limit_class("m2") == "fam" and s.limits_for("m2") == s.limits_for("m1")
    assert Route(s, "m1", None).scope == Route(s, "m2", None).scope == f"llm:{s.key_alias}:fam"
    s = load_settings(limits={"fam": {"rpm": 7, "models": ["x-1", "x-2"]}})
    assert s.limits_for("x-2").rpm == 7 and s.limit_class("x-1") == "fam"
    with pytest.raises(SettingsError, match="two classes"):
        load_settings(limit_groups={"f": ["m"], "g": ["m"]})


# --- the nested acquire ------------------------------------------------------------------------

@pytest.fixture
def lim(redis_client, key_prefix):
    clock = [0]
    limiter = Limiter(redis_client, prefix=key_prefix, clock=lambda: clock[0])
    limiter.clock = clock
    return limiter


KEYS = [("a", ScopeLimits(rpm=60)), ("b", ScopeLimits(rpm=60)), ("c", ScopeLimits(rpm=60))]


def test_the_org_limit_binds_below_the_sum_of_the_keys_and_every_key_is_used(lim):
    org = ScopeLimits(rpm=120)  # 2/s against 3 x 1/s
    grants = [lim.acquire_pool("cls", org, KEYS) for _ in range(9)]
    sends = [g.wait_s for g in grants]
    assert sends == pytest.approx([0, 0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5])  # the org's 2/s
    assert {g.key for g in grants} == {"a", "b", "c"}
    for alias, _ in KEYS:  # no key over its own 1/s: its sends at least 1 s apart
        mine = [g.wait_s for g in grants if g.key == alias]
        assert all(b - a >= 1 - 1e-9 for a, b in zip(mine, mine[1:], strict=False)), mine


def test_the_sum_of_the_keys_binds_below_the_org_limit(lim):
    org = ScopeLimits(rpm=6000)
    grants = [lim.acquire_pool("cls", org, KEYS) for _ in range(9)]
    assert sorted(g.wait_s for g in grants) == pytest.approx([0, 0, 0, 1, 1, 1, 2, 2, 2])


def test_later_turns_stick_to_their_key_while_it_costs_little(lim):
    org = ScopeLimits(rpm=6000)
    keys = [(alias, ScopeLimits(rpm=240, burst_s=0.25)) for alias in "abc"]  # 1 now, 4/s
    first = lim.acquire_pool("cls", org, keys)
    again = lim.acquire_pool("cls", org, keys, prefer=first.key, sticky_s=0.4)
    assert again.key == first.key and again.wait_s == pytest.approx(0.25)
    elsewhere = lim.acquire_pool("cls", org, keys, prefer=first.key, sticky_s=0.4)
    assert elsewhere.key != first.key and elsewhere.wait_s == 0  # 0.5 s later: too dear
    # never further than half the organisation's burst, whatever the setting
    kept = lim.acquire_pool("cls", org, keys, prefer=first.key, sticky_s=30)
    assert kept.key == first.key and kept.wait_s == pytest.approx(0.5)
    capped = lim.acquire_pool("cls", org, keys, prefer=first.key, sticky_s=30)  # 0.75 s
    assert capped.key != first.key and capped.wait_s == 0


def test_a_disabled_key_takes_no_grant_until_enabled(lim):
    org = ScopeLimits(rpm=6000)
    assert lim.disable_key("b", why="401 authentication_error") is True
    assert lim.disable_key("b") is False  # once: one log line
    assert {lim.acquire_pool("cls", org, KEYS).key for _ in range(6)} == {"a", "c"}
    assert lim.disabled_keys()["b"]["reason"] == "401 authentication_error"
    lim.disable_key("a")
    lim.disable_key("c")
    assert lim.acquire_pool("cls", org, KEYS).reason == "disabled"
    assert lim.enable_key("b") and lim.acquire_pool("cls", org, KEYS).key == "b"


def test_a_disabled_key_rejoins_after_its_time(lim):
    org = ScopeLimits(rpm=6000)
    lim.disable_key("a", for_s=5)
    lim.disable_key("b", for_s=5)
    assert lim.acquire_pool("cls", org, KEYS[:2]).reason == "disabled"
    lim.clock[0] += 5_000_001
    assert lim.acquire_pool("cls", org, KEYS[:2]).granted


def test_a_pool_shares_one_hash_tag_and_lists_every_level(lim, redis_client, key_prefix):
    org = ScopeLimits(rpm=60, itpm=600)
    g = lim.acquire_pool("cls", org, KEYS, input_tokens=10)
    lim.settle(org_scope("cls"), org, g, input_tokens=12, output_tokens=0)
    lim.settle(pool_scope(g.key, "cls"), KEYS[0][1], g, input_tokens=12, output_tokens=0)
    lim.disable_key("c")
    keys = list(redis_client.scan_iter(match=f"{key_prefix}:*"))
    assert len({key_slot(k.encode()) for k in keys}) == 1, keys
    assert set(lim.scopes()) == {org_scope("cls"), pool_scope(g.key, "cls")}
    assert lim.state(org_scope("cls"))["leases"] == lim.state(pool_scope(g.key, "cls"))[
        "leases"] == 0


# --- headers and cooldowns by level ------------------------------------------------------------

def _headers(limit: float, remaining: float) -> dict[str, str]:
    return {"anthropic-ratelimit-input-tokens-limit": str(limit),
            "anthropic-ratelimit-input-tokens-remaining": str(remaining),
            "anthropic-ratelimit-requests-limit": "1000",
            "anthropic-ratelimit-requests-remaining": "900"}


def test_each_level_folds_in_only_the_headers_about_it():
    org = load_settings(itpm=90_000, rpm=1000).limits_for(load_settings().model)
    key = org.model_copy(update={"itpm": 30_000, "rpm": None})
    read = ANTHROPIC.read_limits
    org_h, key_h = split_readings(read(_headers(30_000, 0)), org, key)
    assert "input" in key_h["remaining"]
    assert "input" not in org_h["remaining"]
    assert "requests" in org_h["remaining"]
    assert levels_of_429(read(_headers(30_000, 0)), org, key) == ["key"]
    assert levels_of_429(read(_headers(90_000, 0)), org, key) == ["org"]
    assert levels_of_429(read({}), org, key) == ["key", "org"]


def test_a_429_cools_down_the_level_whose_limit_it_hit(monkeypatch, redis_url, key_prefix):
    monkeypatch.setenv("DROVER_KEYS", _keys({"alias": "a", "itpm": 30_000},
                                            {"alias": "b", "itpm": 30_000}))
    settings = load_settings(itpm=90_000, rpm=1000, key_prefix=key_prefix)

    async def run() -> tuple[dict, dict, dict, dict]:
        client = aredis.Redis.from_url(redis_url)
        limiter = AsyncLimiter(client, prefix=key_prefix)
        route = Route(settings, settings.model, None, Pool(settings.keys, {"a": 1, "b": 2}))
        grant = await route.acquire(limiter, input_tokens=10, output_tokens=10,
                                    lease_ttl_s=60, prefer=None)
        await route.cooldown(limiter, grant, 5, _headers(30_000, 0))  # the key's limit
        key_cd = await limiter.state(route.key(grant).scope)
        org_cd = await limiter.state(route.scope)
        other = await route.acquire(limiter, input_tokens=10, output_tokens=10,
                                    lease_ttl_s=60, prefer=grant.key)
        assert other.granted and other.key != grant.key and other.wait_s == 0
        # A call granted earlier asks, before its send, whether a cooldown now holds on a
        # level it reserved in: the cooled key's grant is held back (its lease gone from
        # both levels), the other key's is not.
        leases = (await limiter.state(route.scope))["leases"]
        assert await route.hold_back(limiter, grant) > 4
        assert (await limiter.state(route.scope))["leases"] == leases - 1
        assert (await limiter.state(route.key(grant).scope))["leases"] == 0
        assert await route.hold_back(limiter, other) == 0
        await route.cooldown(limiter, other, 5, _headers(90_000, 0))  # the organisation's
        assert await route.hold_back(limiter, other) > 4  # the organisation's holds every key
        org_after = await limiter.state(route.scope)
        last = await route.acquire(limiter, input_tokens=10, output_tokens=10,
                                   lease_ttl_s=60, prefer=None)
        await client.aclose()
        return key_cd, org_cd, org_after, last

    key_cd, org_cd, org_after, last = asyncio.run(run())
    assert key_cd["cooldown_s"] > 4 and org_cd["cooldown_s"] == 0
    assert org_after["cooldown_s"] > 4
    assert not last.granted or last.wait_s > 4  # every key waits for the organisation


def test_no_redis_key_and_no_log_line_holds_a_key(redis_url, key_prefix, lim, caplog):
    lim.disable_key("a", why="401 authentication_error: invalid x-api-key")
    client = redis.Redis.from_url(redis_url)
    for k in client.scan_iter(match=f"{key_prefix}:*"):
        kind = client.type(k).decode()
        dump = str(client.hgetall(k)) if kind == "hash" else str(client.dump(k))
        assert SECRET not in dump and SECRET not in k.decode()
    client.close()


def test_a_grant_on_a_key_disabled_while_it_waited_is_held_back_not_sent(
        monkeypatch, redis_url, key_prefix):
    """The disable reaches a call granted before it, right before its send (hold_back.lua):
    a key refused on one worker costs no further send of grants other workers hold."""
    monkeypatch.setenv("DROVER_KEYS", _keys({"alias": "a", "itpm": 30_000},
                                            {"alias": "b", "itpm": 30_000}))
    settings = load_settings(itpm=90_000, rpm=1000, key_prefix=key_prefix)

    async def run() -> tuple[float, float, str | None]:
        client = aredis.Redis.from_url(redis_url)
        limiter = AsyncLimiter(client, prefix=key_prefix)
        route = Route(settings, settings.model, None, Pool(settings.keys, {"a": 1, "b": 2}))
        grant = await route.acquire(limiter, input_tokens=10, output_tokens=10,
                                    lease_ttl_s=60, prefer=None)
        other = next(k.alias for k in settings.keys if k.alias != grant.key)
        before = await route.hold_back(limiter, grant)
        await limiter.disable_key(grant.key, why="401 authentication_error: test")
        after = await route.hold_back(limiter, grant)
        moved = await route.acquire(limiter, input_tokens=10, output_tokens=10,
                                    lease_ttl_s=60, prefer=grant.key)
        await client.aclose()
        assert moved.key == other
        return before, after, moved.key

    before, after, _ = asyncio.run(run())
    assert before == 0 and after > 3600, (before, after)


def test_a_call_reserves_at_most_a_full_output_bucket(monkeypatch):
    """An output estimate larger than the output bucket (400 tokens before a scope's first
    answers; 12,000 OTPM at 0.95 in 0.8 s: 152) reserves the bucket: the limiter debits no
    more than that, and planning the call on more made it wait for room no bucket holds."""
    s = load_settings(model="m1", otpm=12_000, burst_seconds=1.0)
    route = Route(s, "m1", None)
    bucket = route.limits.otpm / 60 * route.limits.burst_s
    assert route.output_reservation(400) == int(bucket) < 400
    assert route.output_reservation(100) == 100  # a smaller estimate is reserved whole
    monkeypatch.setenv("DROVER_KEYS", _keys({"alias": "a", "otpm": 6_000}, {"alias": "b"}))
    pooled = Route(load_settings(model="m1", otpm=12_000, burst_seconds=1.0), "m1", None,
                   Pool(load_settings().keys, {"a": 1, "b": 2}))
    assert pooled.output_reservation(400) == int(6_000 * 0.95 / 60 * pooled.limits.burst_s)
    big = Route(load_settings(model="m1", otpm=6_000_000), "m1", None)
    assert big.output_reservation(400) == 400  # a bucket of tens of thousands holds it
