-- pool_acquire.lua: reserve one request and its token estimate, at once, in the buckets of
-- an organisation (a model class's limits over every key) and of one key of its pool (that
-- key's workspace's limits), choosing the key whose grant comes first.
-- KEYS[1..5]  the organisation's scope (see _lib.lua)
-- KEYS[6]     the pool's disabled keys: hash alias -> disabled until (us); past = enabled
-- KEYS[7 + 5 (i - 1) .. +4]  candidate key i's scope
-- ARGV[1..6]  the organisation's limits (as _lib.lua's ARGV[1..6])
-- ARGV[7] input tokens   ARGV[8] output tokens   ARGV[9] horizon_s
-- ARGV[10] max_in_flight over the pool ('' = no limit)   ARGV[11] lease_ttl_s
-- ARGV[12] lease id   ARGV[13] n, the number of candidates
-- ARGV[14] the preferred candidate (0 = none): the key of the caller's earlier turns
-- ARGV[15] stickiness (s): the preferred key wins while its send comes at most this late
--          (and at most half the organisation's burst_s later)
-- ARGV[16 + 7 (i - 1)] candidate i's alias, then its six limit arguments (as ARGV[1..6])
-- Returns {reason, seconds, now_us, chosen candidate}. reason ok: granted in both, send
-- after `seconds`; horizon | cooldown | in_flight: nothing was debited, come back after
-- `seconds`; disabled: every candidate is disabled.
--
-- Each level plans as acquire.lua does; a candidate's send is the later of its own and the
-- organisation's. The first send wins; ties (within a millisecond) go to the emptiest key
-- (the highest lowest level as a fraction of capacity), so idle keys fill evenly.

local now = now_us()
local cost = {1, tonumber(ARGV[7]), tonumber(ARGV[8])}
local horizon = tonumber(ARGV[9]) * 1e6
local max_in_flight = tonumber(ARGV[10])
local n, preferred, sticky = tonumber(ARGV[13]), tonumber(ARGV[14]), tonumber(ARGV[15]) * 1e6
local args = ARGV

local function later(reason, us, chosen)
  return {reason, num(math.max(us / 1e6, 0.05)), num(now), tostring(chosen or 0)}
end

-- The earliest send a level allows, and the same judged with costs capped at capacity.
local function plan(b, send, judged)
  for k = 1, 3 do
    if b.per[k] and (k == 1 or cost[k] > 0) then
      send = math.max(send, b.tat[k] + cost[k] * b.per[k] - b.burst)
      judged = math.max(judged, b.tat[k] + math.min(cost[k] * b.per[k], b.burst) - b.burst)
    end
  end
  return send, judged
end

local function fullness(b)
  local least = 1
  for k = 1, 3 do
    if b.per[k] then least = math.min(least, (b.cap[k] - (b.tat[k] - now) / b.per[k]) / b.cap[k]) end
  end
  return least
end

local ORG_ARGV = {args[1], args[2], args[3], args[4], args[5], args[6]}
use_scope(1, ORG_ARGV)
local org = load(now)
if org.cd - now > horizon then return later('cooldown', org.cd - now - horizon) end

if max_in_flight then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', num(now))  -- leases of dead workers
  if redis.call('ZCARD', KEYS[2]) >= max_in_flight then
    local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    local poll = math.max(0.005, math.min(0.1, (tonumber(first[2]) - now) / 1e6))
    return {'in_flight', num(poll), num(now), '0'}
  end
end
local org_send, org_judged = plan(org, math.max(now, org.cd), math.max(now, org.cd))

local off = redis.call('HGETALL', CALL_KEYS[6])
local disabled = {}
for j = 1, #off, 2 do
  if tonumber(off[j + 1]) > now then disabled[off[j]] = true end
end

local best, pick = nil, {}
for i = 1, n do
  local base = 16 + 7 * (i - 1)
  if not disabled[args[base]] then
    local argv = {args[base + 1], args[base + 2], args[base + 3], args[base + 4],
                  args[base + 5], args[base + 6]}
    use_scope(7 + 5 * (i - 1), argv)
    local b = load(now)
    local send, judged = plan(b, math.max(org_send, b.cd), math.max(org_judged, b.cd))
    local c = {i = i, b = b, argv = argv, send = send, judged = judged, full = fullness(b)}
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
local mine = pick[preferred]
if mine and mine.send <= best.send + math.min(sticky, org.burst / 2) then best = mine end

local cd = math.max(org.cd, best.b.cd)
if cd - now > horizon then return later('cooldown', cd - now - horizon, best.i) end
if best.judged - now > horizon then return later('horizon', best.judged - now - horizon, best.i) end

local expiry = best.send + tonumber(args[11]) * 1e6
local function debit(b, first_key, argv)
  use_scope(first_key, argv)
  for k = 1, 3 do
    if b.per[k] and (k == 1 or cost[k] > 0) then
      b.tat[k] = math.max(b.tat[k], best.send) + math.min(cost[k] * b.per[k], b.burst)
    end
  end
  redis.call('ZADD', KEYS[2], num(expiry), args[12])
  b.lx = math.max(b.lx, expiry)
  redis.call('PEXPIRE', KEYS[2], string.format('%d', math.ceil((b.lx - now) / 1000) + 1000))
  save(b, now)
end
debit(org, 1, ORG_ARGV)
debit(best.b, 7 + 5 * (best.i - 1), best.argv)
return {'ok', num((best.send - now) / 1e6), num(now), tostring(best.i)}
