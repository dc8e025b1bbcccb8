-- acquire.lua: reserve one request (and its token estimate) from every dimension of a scope,
-- atomically. Prepended with _lib.lua (KEYS[1..5] and A[1..6] = ARGV[1] are described there).
-- A[7] input_tokens   A[8] output_tokens   A[9] horizon_s
-- A[10] max_in_flight (NaN = no limit)   A[11] lease_ttl_s   A[12] stats_window_s
-- ARGV[2] lease id
-- Returns one string "<reason> <wait_s or retry_after_s> <now_us> <register 0|1>";
-- reason is ok | horizon | cooldown | in_flight; ok means granted (the second field is then
-- the wait, else the time to come back).
-- Reservation: debit first, then wait until the debit is covered; never further than the
-- horizon. Sends of one scope leave in the order of their reservations. A request costlier
-- than a bucket's capacity is judged on min(cost, capacity) for the horizon test (so it is
-- not refused for ever) but still waits for its full cost.
-- Per call when nothing waits: TIME, GET, ZCOUNT, ZADD, SET, HINCRBY; everything else only
-- on a refusal or about once a minute (TTL extensions, pruning, the scope registry) or
-- second (the stats index).

local MIN_RETRY_S = 0.05

-- A send of cost c at time s (us) as the send-side bucket sees it. The level it finds is
-- noted in the peak ring (refunds are bounded by it). A send planned before the latest
-- one only lowers the levels, so it notes nothing.
local function sent(d, s, c)
  c = min(c, d.cap)
  if not d.q then
    peak(d, s, d.cap)
    d.S = d.cap - c; d.q = s
  elseif s >= d.q then
    local pre = min(d.cap, d.S + d.rate * ((s - d.q) / 1e6))
    peak(d, s, pre)
    d.S = pre - c; d.q = s
  else
    d.S = d.S - c
  end
end

local now = clock()
local cost = {1, A[7], A[8]}
local horizon = A[9]
local max_if = A[10]
local window = A[12]
local st = load(now, call('GET', KEYS[1]))
local now_s = format('%d', now)

local cd_rem = max(0, (st.cd - now) / 1e6)
if cd_rem > horizon then
  return 'cooldown ' .. fmt(max(cd_rem - horizon, MIN_RETRY_S)) .. ' ' .. now_s .. ' 0'
end

-- Leases that expired (their worker died) are not counted; they are removed only when that
-- matters (a refusal) and once a minute, not on every call.
local live = call('ZCOUNT', KEYS[2], '(' .. now_s, '(+inf')
if max_if and live >= max_if then
  call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  local first = call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  local poll = max(0.005, min(0.1, (tonumber(first[2]) - now) / 1e6))
  return 'in_flight ' .. fmt(poll) .. ' ' .. now_s .. ' 0'
end

local base = (st.t - now) / 1e6
local need, need_h = 0, 0
for k = 1, 3 do
  local d = st.dims[k]
  if d and (k == 1 or cost[k] > 0) then
    need = max(need, (cost[k] - d.level) / d.rate)
    need_h = max(need_h, (min(cost[k], d.cap) - d.level) / d.rate)
  end
end
local wait = max(cd_rem, base + need)
local wait_h = max(cd_rem, base + need_h)
if wait_h > horizon then
  return 'horizon ' .. fmt(max(wait_h - horizon, MIN_RETRY_S)) .. ' ' .. now_s .. ' 0'
end

-- Tokens are spent at the send time, not now: headroom that would overflow the capacity
-- before then is not ours to hand out (else a request held back by one dimension would
-- bunch up with later ones in the others). A request costlier than the capacity absorbs
-- all refill until it goes (its level is then 0).
local ahead = wait - base
for k = 1, 3 do
  local d = st.dims[k]
  if d and (k == 1 or cost[k] > 0) then
    d.level = min(d.level, d.cap - d.rate * ahead) - min(cost[k], d.cap)
    sent(d, now + wait * 1e6, cost[k])
  end
end
local expiry = now + (wait + A[11]) * 1e6
-- The lease set must outlive its latest lease. The bucket keeps the set's expiry (st.lx), so
-- no PTTL is needed, and the set holds a member '~' at +inf that keeps it from being deleted
-- by the ZREM of its last lease: ZADD adds 2 members only to a new set, which then gets its
-- TTL; else the TTL is extended only when this lease would outlive it, with a minute of
-- slack so that this is not needed on every call as time moves on.
local new_set = call('ZADD', KEYS[2], expiry, ARGV[2], 'inf', '~') == 2
local lease_need = expiry + 1e6
if new_set or st.lx == nil or lease_need > st.lx then
  st.lx = lease_need + 60e6
  call('PEXPIRE', KEYS[2], format('%d', ceil((st.lx - now) / 1000)))
end

local minute = floor(now / 60e6)
local register = ' 0'
if st.reg ~= minute then
  register = ' 1'
  st.reg = minute
  call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
end
save(st)

stat_add(window, now, floor((now + wait * 1e6) / 1e6), 'requests', 1)
if wait > 0 then
  local sec = floor(now / 1e6)
  stat_add(window, now, sec, 'waits', 1)
  stat_add(window, now, sec, 'wait_ms', floor(wait * 1000 + 0.5))
  return 'ok ' .. fmt(wait) .. ' ' .. now_s .. register
end
return 'ok 0 ' .. now_s .. register
