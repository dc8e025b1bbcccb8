-- acquire.lua: reserve one request and its token estimate in every dimension of a scope, at
-- once. KEYS and ARGV[1..6]: see _lib.lua.
-- ARGV[7] input tokens   ARGV[8] output tokens   ARGV[9] horizon_s
-- ARGV[10] max_in_flight ('' = no limit)   ARGV[11] lease_ttl_s   ARGV[12] lease id
-- Returns {reason, seconds, now_us}. reason ok: granted, send after `seconds`;
-- horizon | cooldown | in_flight: nothing was debited, come back after `seconds`.
--
-- The send time s is the earliest instant at which every limited dimension with a cost
-- (requests always) holds it, reservations already made included; then each such tat moves
-- to max(tat, s) + cost x per. A cost above a bucket's capacity is debited as the capacity
-- (and judged so against the horizon, so it is not refused for ever), but s waits for all
-- of it: the refill meanwhile is its.

local now = now_us()
local b = load(now)
local cost = {1, tonumber(ARGV[7]), tonumber(ARGV[8])}
local horizon = tonumber(ARGV[9]) * 1e6
local max_in_flight = tonumber(ARGV[10])

local function later(reason, us)
  return {reason, num(math.max(us / 1e6, 0.05)), num(now)}
end

if b.cd - now > horizon then return later('cooldown', b.cd - now - horizon) end

if max_in_flight then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', num(now))  -- leases of dead workers
  if redis.call('ZCARD', KEYS[2]) >= max_in_flight then
    local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    local poll = math.max(0.005, math.min(0.1, (tonumber(first[2]) - now) / 1e6))
    return {'in_flight', num(poll), num(now)}
  end
end

local send, judged = math.max(now, b.cd), math.max(now, b.cd)
for k = 1, 3 do
  if b.per[k] and (k == 1 or cost[k] > 0) then
    send = math.max(send, b.tat[k] + cost[k] * b.per[k] - b.burst)
    judged = math.max(judged, b.tat[k] + math.min(cost[k] * b.per[k], b.burst) - b.burst)
  end
end
if judged - now > horizon then return later('horizon', judged - now - horizon) end

for k = 1, 3 do
  if b.per[k] and (k == 1 or cost[k] > 0) then
    b.tat[k] = math.max(b.tat[k], send) + math.min(cost[k] * b.per[k], b.burst)
  end
end

local expiry = send + tonumber(ARGV[11]) * 1e6
redis.call('ZADD', KEYS[2], num(expiry), ARGV[12])
b.lx = math.max(b.lx, expiry)
redis.call('PEXPIRE', KEYS[2], string.format('%d', math.ceil((b.lx - now) / 1000) + 1000))

save(b, now)
return {'ok', num((send - now) / 1e6), num(now)}
