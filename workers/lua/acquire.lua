-- acquire.lua: reserve one request (and its token estimate) from every dimension of a scope,
-- atomically. Prepended with _lib.lua (KEYS[1..5], ARGV[1..6] are described there).
-- KEYS[1] bucket  KEYS[2] leases  KEYS[3] learned  KEYS[4] stats  KEYS[5] statidx
-- ARGV[1..3] limits/min (requests, input, output)   ARGV[4] burst_s   ARGV[5] learned util
-- ARGV[6] now_us override, EMPTY IN PRODUCTION
-- ARGV[7] input_tokens   ARGV[8] output_tokens   ARGV[9] horizon_s
-- ARGV[10] max_in_flight ('' = no limit)   ARGV[11] lease id   ARGV[12] lease_ttl_s
-- ARGV[13] stats_window_s
-- Returns {granted 0|1, wait_s, retry_after_s, reason, now_us, register 0|1} (numbers as strings)
-- Reservation: debit first, then wait until the debit is covered; never further than the
-- horizon. Sends of one scope leave in the order of their reservations. A request costlier than a bucket's capacity is judged on min(cost, capacity) for
-- the horizon test (so it is not refused for ever) but still waits for its full cost.

local MIN_RETRY_S = 0.05
local now = clock()
local cost = {1, tonumber(ARGV[7]), tonumber(ARGV[8])}
local horizon = tonumber(ARGV[9])
local max_if = tonumber(ARGV[10])
local window = tonumber(ARGV[13])
local st = load(now)

local cd_rem = math.max(0, (st.cd - now) / 1e6)
if cd_rem > horizon then
  return {0, '0', fmt(math.max(cd_rem - horizon, MIN_RETRY_S)), 'cooldown', fmt(now), 0}
end

redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if max_if and redis.call('ZCARD', KEYS[2]) >= max_if then
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  local poll = math.max(0.005, math.min(0.1, (tonumber(first[2]) - now) / 1e6))
  return {0, '0', fmt(poll), 'in_flight', fmt(now), 0}
end

local base = (st.t - now) / 1e6
local need, need_h = 0, 0
for k = 1, 3 do
  local d = st.dims[k]
  if d and (k == 1 or cost[k] > 0) then
    need = math.max(need, (cost[k] - d.level) / d.rate)
    need_h = math.max(need_h, (math.min(cost[k], d.cap) - d.level) / d.rate)
  end
end
local wait = math.max(cd_rem, base + need)
local wait_h = math.max(cd_rem, base + need_h)
if wait_h > horizon then
  return {0, '0', fmt(math.max(wait_h - horizon, MIN_RETRY_S)), 'horizon', fmt(now), 0}
end

-- Tokens are spent at the send time, not now: headroom that would overflow the capacity
-- before then is not ours to hand out (else a request held back by one dimension would
-- bunch up with later ones in the others). A request costlier than the capacity absorbs
-- all refill until it goes (its level is then 0).
local ahead = wait - base
for k = 1, 3 do
  local d = st.dims[k]
  if d and (k == 1 or cost[k] > 0) then
    d.level = math.min(d.level, d.cap - d.rate * ahead) - math.min(cost[k], d.cap)
    sent(d, now + wait * 1e6, cost[k])
  end
end
local expiry = now + (wait + tonumber(ARGV[12])) * 1e6
redis.call('ZADD', KEYS[2], expiry, ARGV[11])
local lease_ms = math.ceil((expiry - now) / 1000) + 1000
if redis.call('PTTL', KEYS[2]) < lease_ms then
  redis.call('PEXPIRE', KEYS[2], lease_ms)
end

local minute = tostring(math.floor(now / 60e6))
local register = 0
if st.reg ~= minute then
  register = 1
  redis.call('HSET', KEYS[1], 'reg', minute)
end
save(st)

stat_add(window, now, math.floor((now + wait * 1e6) / 1e6), 'requests', 1)
if wait > 0 then
  local sec = math.floor(now / 1e6)
  stat_add(window, now, sec, 'waits', 1)
  stat_add(window, now, sec, 'wait_ms', math.floor(wait * 1000 + 0.5))
end
return {1, fmt(wait), '0', 'ok', fmt(now), register}
