-- acquire.lua: reserve one request and its token estimate in every dimension of a scope, at
-- once.
-- KEYS[1..6]  the scope's (see _lib.lua)
-- ARGV[1]     {limits, input_tokens, output_tokens, horizon_s, max_in_flight (absent = no
--             cap), lease_ttl_s, lease: the lease id}
-- Returns {reason, seconds, now_us}. reason ok: granted, send after `seconds`;
-- horizon | cooldown | in_flight: nothing was debited, come back after `seconds`.
--
-- The send is planned at the earliest instant at which every limited dimension with a cost
-- holds it (_lib.lua: plan), after any cooldown, and debited there (reserve).

local now = now_us()
local b = load(scope_keys(1), A.limits, now)
local cost = {1, A.input_tokens, A.output_tokens}
local horizon = A.horizon_s * 1e6

local function later(reason, us)
  return {reason, num(math.max(us / 1e6, 0.05)), num(now)}
end

if b.cd - now > horizon then return later('cooldown', b.cd - now - horizon) end
local poll = leases_full(b.keys, A.max_in_flight, now)
if poll then return {'in_flight', num(poll), num(now)} end
local send, judged = plan(b, cost, math.max(now, b.cd), math.max(now, b.cd))
if judged - now > horizon then return later('horizon', judged - now - horizon) end
reserve(b, cost, send, A.lease, send + A.lease_ttl_s * 1e6, now)
return {'ok', num((send - now) / 1e6), num(now)}
