-- acquire.lua: reserve one request and its token estimate in every dimension of a scope, at
-- once; for a pool of keys, in the buckets of an organisation (a model class's limits over
-- every key) and of one key of its pool (that key's workspace's limits), choosing the key
-- whose grant comes first.
-- Preamble: _bucket
-- KEYS[1..6]               the scope's, or a pool's organisation's (see _lib.lua)
-- KEYS[7]                  a pool's disabled keys: hash alias -> disabled until (us); past
--                          = enabled
-- KEYS[8 + 6 (i - 1) ..]   a pool's candidate key i's scope (six keys)
-- ARGV[1]  {limits, input_tokens, output_tokens, max_tokens (the call's: a tokens bucket
--          takes at least input + max tokens at admission; absent = no floor), horizon_s,
--          max_in_flight (over the organisation; absent = no cap), lease_ttl_s, lease: the
--          lease id; a pool's also candidates: [{alias, limits, alone: under no
--          organisation (a cloud's entry): neither its cooldown nor its buckets hold it, and
--          its grant is debited in its own buckets only}, ...], prefer: the index of the key
--          of the caller's earlier turns (absent = none), sticky_s: the preferred key wins while its send comes at
--          most this late (and at most half the organisation's burst_s)}
-- Returns {reason, seconds, now_us, chosen candidate (0: none)}. reason ok: granted (in
-- both levels), send after `seconds`; horizon | cooldown | in_flight: nothing was debited,
-- come back after `seconds`; disabled: every candidate is disabled.
--
-- The send is planned at the earliest instant at which every limited dimension with a cost
-- holds it (_bucket.lua: plan), after any cooldown, and debited there (reserve). In a pool
-- a candidate's send is the later of its own and the organisation's. The first send wins;
-- ties (within a millisecond) go to the emptiest key (the highest lowest level as a
-- fraction of capacity), so idle keys fill evenly. A job is thus spread over every entry
-- of the pool by free capacity, the Anthropic API's keys, Bedrock's and Vertex AI's alike.

local cost = per_dim(1, A.input_tokens, A.output_tokens, A.max_tokens)
local horizon = A.horizon_s * 1e6

local function later(reason, us, chosen)
  return {reason, num(math.max(us / 1e6, 0.05)), num(now), tostring(chosen or 0)}
end

local function fullness(b)  -- the lowest level, as a fraction of capacity
  local least = 1
  for d, per in pairs(b.per) do least = math.min(least, 1 - (b.tat[d] - now) / per / b.cap[d]) end
  return least
end

local top = load(scope_keys(1), A.limits)
local poll = leases_full(top.keys, A.max_in_flight)
local best = {i = 0, cd = top.cd}
best.send, best.judged = plan(top, cost, math.max(now, top.cd), math.max(now, top.cd))

if not A.candidates then
  if top.cd - now > horizon then return later('cooldown', top.cd - now - horizon) end
  if poll then return {'in_flight', num(poll), num(now), '0'} end
else
  -- A candidate `alone` (a cloud's entry) is under no organisation: planned on its own
  -- buckets, past the organisation's cooldown and in-flight cap, which it does not count in.
  local disabled, org, mine, capped = hash(KEYS[7]), best, nil, false
  local free = {send = now, judged = now, cd = 0}
  best = nil
  for i, candidate in ipairs(A.candidates) do
    if not (disabled[candidate.alias] and disabled[candidate.alias] > now) then
      if poll and not candidate.alone then
        capped = true
      else
        local under = candidate.alone and free or org
        local b = load(scope_keys(8 + 6 * (i - 1)), candidate.limits)
        local c = {i = i, b = b, cd = math.max(under.cd, b.cd), full = fullness(b),
                   alone = candidate.alone}
        c.send, c.judged = plan(b, cost, math.max(under.send, b.cd),
                                math.max(under.judged, b.cd))
        if i == A.prefer then mine = c end
        if not best or c.send < best.send - 1000
            or (c.send <= best.send + 1000 and c.full > best.full) then
          best = c
        end
      end
    end
  end
  if not best and capped then return {'in_flight', num(poll), num(now), '0'} end
  if not best then return {'disabled', '0', num(now), '0'} end
  -- A send later than the organisation's own earliest moves its level down to that instant
  -- (one arrival time cannot hold a debit in the future): capping the stickiness at half
  -- the organisation's burst keeps that from ever delaying another key's grant.
  if mine and mine.send <= best.send + math.min(A.sticky_s * 1e6, top.burst / 2) then
    best = mine
  end
end

if best.cd - now > horizon then return later('cooldown', best.cd - now - horizon, best.i) end
if best.judged - now > horizon then return later('horizon', best.judged - now - horizon, best.i) end
local expiry = best.send + A.lease_ttl_s * 1e6
if not best.alone then reserve(top, cost, best.send, A.lease, expiry) end
if best.b then reserve(best.b, cost, best.send, A.lease, expiry) end
return {'ok', num((best.send - now) / 1e6), num(now), tostring(best.i)}
