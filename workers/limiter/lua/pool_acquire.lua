-- pool_acquire.lua: reserve one request and its token estimate, at once, in the buckets of
-- an organisation (a model class's limits over every key) and of one key of its pool (that
-- key's workspace's limits), choosing the key whose grant comes first.
-- KEYS[1..6]               the organisation's scope (see _lib.lua)
-- KEYS[7]                  the pool's disabled keys: hash alias -> disabled until (us); past
--                          = enabled
-- KEYS[8 + 6 (i - 1) ..]   candidate key i's scope (six keys)
-- ARGV[1]  {limits: the organisation's, input_tokens, output_tokens, horizon_s,
--          max_in_flight: over the pool (absent = no cap), lease_ttl_s, lease: the lease id,
--          candidates: [{alias, limits}, ...], prefer: the index of the key of the
--          caller's earlier turns (absent = none), sticky_s: the preferred key wins while
--          its send comes at most this late (and at most half the organisation's burst_s)}
-- Returns {reason, seconds, now_us, chosen candidate}. reason ok: granted in both, send
-- after `seconds`; horizon | cooldown | in_flight: nothing was debited, come back after
-- `seconds`; disabled: every candidate is disabled.
--
-- Each level plans as acquire.lua does (_lib.lua: plan); a candidate's send is the later of
-- its own and the organisation's. The first send wins; ties (within a millisecond) go to
-- the emptiest key (the highest lowest level as a fraction of capacity), so idle keys fill
-- evenly.

local now = now_us()
local cost = {1, A.input_tokens, A.output_tokens}
local horizon = A.horizon_s * 1e6

local function later(reason, us, chosen)
  return {reason, num(math.max(us / 1e6, 0.05)), num(now), tostring(chosen or 0)}
end

local function fullness(b)
  local least = 1
  for k = 1, 3 do
    if b.per[k] then least = math.min(least, (b.cap[k] - (b.tat[k] - now) / b.per[k]) / b.cap[k]) end
  end
  return least
end

local org = load(scope_keys(1), A.limits, now)
if org.cd - now > horizon then return later('cooldown', org.cd - now - horizon) end
local poll = leases_full(org.keys, A.max_in_flight, now)
if poll then return {'in_flight', num(poll), num(now), '0'} end
local org_send, org_judged = plan(org, cost, math.max(now, org.cd), math.max(now, org.cd))

local off = redis.call('HGETALL', KEYS[7])
local disabled = {}
for j = 1, #off, 2 do
  if tonumber(off[j + 1]) > now then disabled[off[j]] = true end
end

local best, pick = nil, {}
for i, candidate in ipairs(A.candidates) do
  if not disabled[candidate.alias] then
    local b = load(scope_keys(8 + 6 * (i - 1)), candidate.limits, now)
    local send, judged = plan(b, cost, math.max(org_send, b.cd), math.max(org_judged, b.cd))
    local c = {i = i, b = b, send = send, judged = judged, full = fullness(b)}
    pick[i] = c
    if not best or send < best.send - 1000
        or (send <= best.send + 1000 and c.full > best.full) then
      best = c
    end
  end
end
if not best then return {'disabled', '0', num(now), '0'} end
-- A send later than the organisation's own earliest moves its level down to that instant
-- (one arrival time cannot hold a debit in the future): capping the stickiness at half the
-- organisation's burst keeps that from ever delaying another key's grant.
local mine = A.prefer and pick[A.prefer]
if mine and mine.send <= best.send + math.min(A.sticky_s * 1e6, org.burst / 2) then best = mine end

local cd = math.max(org.cd, best.b.cd)
if cd - now > horizon then return later('cooldown', cd - now - horizon, best.i) end
if best.judged - now > horizon then return later('horizon', best.judged - now - horizon, best.i) end

local expiry = best.send + A.lease_ttl_s * 1e6
reserve(org, cost, best.send, A.lease, expiry, now)
reserve(best.b, cost, best.send, A.lease, expiry, now)
return {'ok', num((best.send - now) / 1e6), num(now), tostring(best.i)}
