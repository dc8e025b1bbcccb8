"""The Lua scripts, a scope's keys, and each operation as a ``Call``: its script, keys, one
JSON argument and what to make of the reply (the two limiters differ only in running it)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Collection, Mapping
from importlib import resources
from typing import Any, NamedTuple

from drover.workers.limiter._scopes import (
    POOL_TAG,
    STAT_FIELDS,
    Grant,
    Held,
    ScopeLimits,
    org_scope,
    pool_scope,
)

__all__ = ["Call", "Clock", "LimiterCore", "Readings"]

# What an answer's limit headers said, read by its provider (drover.workers.providers):
# {"remaining": {dimension: n}, "limit": {dimension: n}}, a dimension named as the provider
# names it; one the scripts do not count is left out.
Readings = Mapping[str, Mapping[str, float]]
# The one table of dimensions: the scripts' letter (their DIMS), the provider's name of it,
# its name in ``state`` and its field in ``ScopeLimits``. A scope has those its limits give.
_DIMS = (("r", "requests", "requests", "rpm"), ("i", "input", "input_tokens", "itpm"),
         ("o", "output", "output_tokens", "otpm"), ("t", "tokens", "tokens", "tpm"))
_LETTERS = {name: d for d, name, _, _ in _DIMS}


def reading_args(readings: Readings | None) -> dict[str, dict[str, float]] | None:
    """The scripts' ``headers`` argument ({remaining: {d: n}, limit: {d: n}}), or None."""
    out = {part: {_LETTERS[d]: float(v) for d, v in ((readings or {}).get(part) or {}).items()
                  if d in _LETTERS} for part in ("remaining", "limit")}
    return out if out["remaining"] or out["limit"] else None

Clock = Callable[[], int]  # Redis-like time in microseconds

_LUA = resources.files("drover.workers.limiter") / "lua"
_SCRIPTS = ("acquire", "settle", "cooldown", "hold_back", "admitted", "sync", "state",
            "record", "usage", "pool_disable")
# With an injected clock (tests) the scripts get the time as their last argument (after the
# JSON one) instead of from TIME; everything else is the same text. Redis still expires keys
# on its own clock, though: a TTL the scripts set from the injected time (a lease's 0.2 s
# plus 1 s) ran out while a slow test, at one instant of its clock, still held the lease
# (test_limiter_model at loads over 20: 0 leases against the model's 1, and Hypothesis'
# FlakyStrategyDefinition when the replay did not fail the same). So there a TTL that is
# still to run (> 0) gets INJECTED_TTL_MARGIN_MS of real time on top; one the injected
# time has passed (<= 0) deletes the key as it does in Redis' time.
INJECTED_TTL_MARGIN_MS = 3_600_000
_INJECTED_CLOCK = f"""local now = tonumber(ARGV[#ARGV])
local redis = setmetatable({{call = function(command, ...)
  if command == 'PEXPIRE' then
    local key, ms = ...
    ms = tonumber(ms)
    if ms > 0 then ms = ms + {INJECTED_TTL_MARGIN_MS} end
    return redis.call(command, key, string.format('%d', ms))
  end
  return redis.call(command, ...)
end}}, {{__index = redis}})
"""
# The counter names for _stats.lua (the order of usage.lua's values) and the dimensions, each
# from the one list of them.
_COUNTERS = ("local STAT_FIELDS = {" + ", ".join(f"'{name}'" for name in STAT_FIELDS) + "}\n"
             "local DIMS = {" + ", ".join(f"'{d}'" for d, *_ in _DIMS) + "}\n")


def _source(name: str, clock: Clock | None) -> str:
    """The script after its preamble: clock, counter names, _lib.lua, the parts it names."""
    text = (_LUA / f"{name}.lua").read_text()
    named = re.search(r"^-- Preamble: (.+)$", text, re.MULTILINE)
    parts = ["_lib", *(named.group(1).split(", ") if named else ())]
    head = _INJECTED_CLOCK if clock is not None else (_LUA / "_clock.lua").read_text()
    return head + _COUNTERS + "".join((_LUA / f"{part}.lua").read_text() for part in parts) + text


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _limits(limits: ScopeLimits | None) -> dict[str, Any] | None:
    """The scripts' ``limits`` argument (see _lib.lua); None: the last write's."""
    if limits is None:
        return None
    per_min = {d: getattr(limits, lim) for d, _, _, lim in _DIMS}
    return {"per_min": {d: float(v) for d, v in per_min.items() if v is not None},
            "burst_s": float(limits.burst_s),
            "learned_utilization": float(limits.learned_utilization),
            "learn_share": limits.learn_share,
            **({"tw": float(limits.output_weight)} if limits.output_weight != 1 else {})}


def _counts(counts: Mapping[str, int] | None) -> dict[str, int]:
    """The counts to add, the zeros left out; ValueError for a name that is no counter."""
    counts = counts or {}
    unknown = sorted(set(counts) - set(STAT_FIELDS))
    if unknown:
        raise ValueError(f"unknown counter(s) {unknown}; expected some of {STAT_FIELDS}")
    return {name: int(n) for name, n in counts.items() if int(n)}


class Call(NamedTuple):
    script: str
    keys: list[str]
    args: list[str]  # the JSON argument (and, with a test clock, the time)
    finish: Callable[[Any], Any]


class LimiterCore:
    def __init__(self, client: Any, *, prefix: str = "drover", horizon_s: float = 15.0,
                 stats_window_s: int = 3600, clock: Clock | None = None) -> None:
        if not horizon_s > 0:
            raise ValueError(f"horizon_s must be > 0, got {horizon_s!r}")
        if stats_window_s < 1:
            raise ValueError(f"stats_window_s must be >= 1, got {stats_window_s!r}")
        self.prefix = prefix
        self.horizon_s = float(horizon_s)
        self.stats_window_s = int(stats_window_s)
        self._clock = clock
        self._client = client
        self._scripts = {name: client.register_script(_source(name, clock))
                         for name in _SCRIPTS}

    def keys(self, scope: str) -> list[str]:
        """A scope's Redis keys: bucket, leases, learned limits, stats, stats index, share
        (see _lib.lua). A scope ``T/NAME`` (a pool's) takes the hash tag ``T``, which the
        others of ``T`` share."""
        if not scope or "{" in scope or "}" in scope:
            raise ValueError(f"a scope must be non-empty and contain no braces: {scope!r}")
        tag, slash, name = scope.partition("/")
        base = f"{self.prefix}:{{{tag}}}/{name}" if slash else f"{self.prefix}:{{{scope}}}"
        return [f"{base}:b", f"{base}:l", f"{base}:hl", f"{base}:s", f"{base}:si", f"{base}:sh"]

    def _off_keys(self) -> list[str]:
        """A pool's disabled keys (alias -> until, us) and why (alias -> 'second|reason')."""
        base = f"{self.prefix}:{{{POOL_TAG}}}/off"
        return [base, f"{base}:why"]

    def _call(self, script: str, keys: list[str], arg: dict[str, Any],
              finish: Callable[[Any], Any] = lambda reply: None) -> Call:
        """``arg``: the script's named arguments; None values are left out (absent in Lua)."""
        args = [json.dumps({k: v for k, v in arg.items() if v is not None},
                           separators=(",", ":"))]
        if self._clock is not None:
            args.append(str(int(self._clock())))
        return Call(script, keys, args, finish)

    def _disable(self, alias: str, for_s: float, why: str) -> Call:
        return self._call("pool_disable", self._off_keys(),
                          {"alias": alias, "for_s": float(for_s), "why": why},
                          lambda reply: bool(int(reply)))

    @staticmethod
    def _disabled_from(until: dict[Any, Any], why: dict[Any, Any], time: tuple[int, int]
                       ) -> dict[str, dict[str, Any]]:
        """``disabled_keys`` from HGETALL of the two hashes and Redis TIME."""
        now, out = time[0] + time[1] / 1e6, {}
        for alias, value in until.items():
            until_s = float(_s(value)) / 1e6
            if until_s <= now:
                continue
            at, _, reason = _s(why.get(alias, b"0|")).partition("|")
            out[_s(alias)] = {"since": float(at or 0), "reason": reason,
                              "until": None if until_s > 1e200 else until_s}
        return out

    # --- the operations ---------------------------------------------------------------------
    def _acquire(self, scope: str, limits: ScopeLimits, input_tokens: int, output_tokens: int,
                 lease_ttl_s: float, pool: list[tuple[str, ScopeLimits]] | None = None,
                 prefer: str | None = None, sticky_s: float = 0.0,
                 max_tokens: int = 0) -> Call:
        """One scope's acquire; with ``pool`` (alias, limits) of a model class (``scope``),
        the organisation's and the first key's (acquire.lua)."""
        if input_tokens < 0 or output_tokens < 0 or max_tokens < 0:
            raise ValueError("token estimates must be >= 0")
        lease = uuid.uuid4().hex
        arg: dict[str, Any] = {"limits": _limits(limits), "input_tokens": input_tokens,
               "output_tokens": output_tokens, "max_tokens": max_tokens or None,
               "horizon_s": self.horizon_s,
               "max_in_flight": limits.max_in_flight, "lease_ttl_s": float(lease_ttl_s),
               "lease": lease}
        aliases = [alias for alias, _ in pool or ()]
        keys = self.keys(scope)
        if pool is not None:
            if not pool:
                raise ValueError("a pool needs at least one key")
            keys = [*self.keys(org_scope(scope)), self._off_keys()[0]]
            for alias in aliases:
                keys += self.keys(pool_scope(alias, scope))
            arg |= {"sticky_s": float(sticky_s), "candidates": [
                {"alias": alias, "limits": _limits(key_limits),
                 **({"alone": True} if key_limits.alone else {})} for alias, key_limits in pool],
                "prefer": aliases.index(prefer) + 1 if prefer in aliases else None}

        def finish(reply: Any) -> Grant:
            reason, seconds, now_us, chosen = (_s(x) for x in reply)
            ok = reason == "ok"
            return Grant(ok, float(seconds) if ok else 0.0, 0.0 if ok else float(seconds),
                         lease if ok else None, reason, input_tokens, output_tokens,
                         float(now_us), aliases[int(chosen) - 1] if int(chosen) else None,
                         max_tokens)

        return self._call("acquire", keys, arg, finish)

    def _settle(self, scope: str, limits: ScopeLimits | None, grant: Grant, sent: bool,
                input_tokens: int, output_tokens: int,
                readings: Readings | None,
                counts: Mapping[str, int] | None = None) -> Call | None:
        if input_tokens < 0 or output_tokens < 0:
            raise ValueError("token counts must be >= 0")
        extra = _counts(counts)
        if not grant.granted or grant.lease_id is None:
            return None
        return self._call("settle", self.keys(scope), {
            "limits": _limits(limits), "sent": sent,
            "reserved": {"input": grant.input_tokens, "output": grant.output_tokens,
                         **({"max_tokens": grant.max_tokens} if grant.max_tokens else {})},
            "used": {"input": int(input_tokens), "output": int(output_tokens)},
            "lease": grant.lease_id, "acquired_s": grant.acquired_s, "send_us": grant.send_us,
            "wait_s": grant.wait_s, "wait_ms": int(grant.wait_s * 1000 + 0.5),
            "stats_window_s": self.stats_window_s,
            "headers": None if limits is None else reading_args(readings),
            "counts": extra})

    def _cooldown(self, scope: str, limits: ScopeLimits, retry_after_s: float,
                  learnable: Collection[str] | None = None) -> Call:
        if not retry_after_s >= 0:
            raise ValueError(f"retry_after_s must be >= 0, got {retry_after_s!r}")
        unknown = sorted(set(learnable or ()) - set(_LETTERS))
        if unknown:
            raise ValueError(f"unknown dimension(s) {unknown}; expected some of "
                             f"{sorted(_LETTERS)}")
        return self._call("cooldown", self.keys(scope), {
            "limits": _limits(limits), "retry_after_s": float(retry_after_s),
            "learnable": None if learnable is None else [_LETTERS[d] for d in learnable]},
            lambda reply: float(_s(reply)))

    def _hold_back(self, grant: Grant, scopes: list[str], stop: str | None = None,
                   report: bool = False) -> Call | None:
        if not scopes:
            raise ValueError("hold_back needs at least one scope")
        if not grant.granted or grant.lease_id is None:
            return None
        keys = [key for scope in scopes for key in self.keys(scope)[:2]]
        # A pool's key disabled since the grant holds it too; ``stop``'s (the one key's)
        # stopped fleet-wide answers inf.
        if grant.key is not None or stop is not None:
            keys.append(self._off_keys()[0])
        return self._call("hold_back", keys, {"lease": grant.lease_id, "key": grant.key,
                                              "stop": stop, "out": grant.output_tokens,
                                              "inp": grant.input_tokens,
                                              "m": grant.max_tokens or None,
                                              "hdr": report or None},
                          lambda reply: Held.paced() if _s(reply) == "paced"
                          else Held(_s(reply)))

    def _admitted(self, grant: Grant, scopes: list[str]) -> Call | None:
        if not grant.granted or grant.lease_id is None:
            return None
        return self._call("admitted", [self.keys(scope)[0] for scope in scopes],
                          {"inp": grant.input_tokens})

    def _sync(self, scope: str, limits: ScopeLimits, readings: Readings) -> Call | None:
        folded = reading_args(readings)
        return None if folded is None else self._call(
            "sync", self.keys(scope), {"limits": _limits(limits), "headers": folded})

    def _record(self, scope: str, counts: Mapping[str, int]) -> Call | None:
        added = _counts(counts)  # nothing to add: no call
        return self._call("record", self.keys(scope), {
            "stats_window_s": self.stats_window_s, "counts": added}) if added else None

    def _usage(self, scope: str, seconds: int) -> Call:
        if seconds < 1:
            raise ValueError(f"seconds must be >= 1, got {seconds!r}")

        def finish(reply: Any) -> list[dict[str, int]]:
            first, values, n = int(_s(reply[0])), [_s(v) for v in reply[1:]], len(STAT_FIELDS)
            return [{"t": first + i, **{name: int(values[i * n + j] or 0)
                                        for j, name in enumerate(STAT_FIELDS)}}
                    for i in range(len(values) // n)]

        return self._call("usage", self.keys(scope), {"seconds": int(seconds)}, finish)

    def _scan_pattern(self) -> str:
        """Matches the bucket and counters of every scope: a scope is listed while either
        lives (the counters expire a minute after the stats window)."""
        prefix = "".join(f"\\{c}" if c in "*?[]\\" else c for c in self.prefix)
        return f"{prefix}:{{*:[bs]"

    def _scope_names(self, keys: list[Any]) -> list[str]:
        start = len(self.prefix) + 2  # past "{prefix}:{"
        names = set()
        for key in keys:
            tag, _, rest = _s(key)[start:-2].partition("}")  # without the ":b" or ":s"
            if rest == "" or rest.startswith("/"):
                names.add(tag + rest)
        return sorted(names)

    def _state(self, scope: str, limits: ScopeLimits | None) -> Call:
        def finish(reply: Any) -> dict[str, Any]:
            r = json.loads(_s(reply))
            got = r["learned"] or {}  # an empty table may come back as a JSON list
            out: dict[str, Any] = {
                "now": float(r["now_us"]) / 1e6, "cooldown_s": float(r["cooldown_s"]),
                "leases": int(r["leases"]), "burst_s": float(r["burst_s"]),
                "learned": {lim: float(got[d]) if d in got else None for d, *_, lim in _DIMS}}
            for d, _, name, _ in _DIMS:  # rate and capacity: with the share
                dim = {k: float(v) for k, v in r.get(d, {}).items()}
                out[name] = {**dim, "rate_per_s": dim["limit_per_min"] * dim["share"] / 60
                             } if dim else None
            return out

        return self._call("state", self.keys(scope), {"limits": _limits(limits)}, finish)
