-- acquire.lua: reserve one request (and its token estimate) from every dimension of a scope,
-- atomically. Prepended with _head.lua (KEYS, the bucket record and A[1..6] = ARGV[1] are
-- described there; only KEYS[1..3] are passed: a grant's counters are written when it is
-- settled or released).
-- A[7] input_tokens   A[8] output_tokens   A[9] horizon_s
-- A[10] max_in_flight (NaN = no limit)   A[11] lease_ttl_s
-- ARGV[2] lease id
-- Returns one string "<reason> <wait_s or retry_after_s> <now_us> <register 0|1>";
-- reason is ok | horizon | cooldown | in_flight; ok means granted (the second field is then
-- the wait, else the time to come back).
-- Reservation: debit first, then wait until the debit is covered; never further than the
-- horizon. Sends of one scope leave in the order of their reservations. A request costlier
-- than a bucket's capacity is judged on min(cost, capacity) for the horizon test (so it is
-- not refused for ever) but still waits for its full cost.
-- Per call when nothing waits: TIME, GET, ZADD, SET; everything else only on a refusal,
-- near max_in_flight (counting the leases), or about once a minute (TTL extensions, pruning,
-- the scope registry).

-- This is the path before every call, so it defines no function: in a script each function
-- is a new closure (with its upvalues) on every call. It includes the fragments that
-- _lib.lua's clock(), load(), peak() and save() are made of in place instead
-- (`--#include _name` lines, replaced by workers/limiter.py with _name.lua).

local MIN_RETRY_S = 0.05

local now = A[6]  -- clock()
--#include _clock
local cost = {1, A[7], A[8]}
local horizon = A[9]
local max_if = A[10]
local now_s = format('%d', now)

local raw = call('GET', KEYS[1])
local h
--#include _load

local cd_rem = max(0, (h[CD] - now) / 1e6)
if cd_rem > horizon then
  return 'cooldown ' .. format('%.17g', max(cd_rem - horizon, MIN_RETRY_S)) .. ' ' .. now_s
         .. ' 0'
end

-- In-flight leases: the bucket keeps how many the set holds (h[NL]), live or expired (their
-- worker died). Below the limit that bound is enough; at it (or when unknown) the expired
-- ones are removed and the rest counted, so a count is never taken on the common path.
local nl = h[NL]
if max_if and not (nl < max_if) then
  call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  nl = call('ZCOUNT', KEYS[2], '-inf', '(+inf')
  if nl >= max_if then
    local first = call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    local poll = max(0.005, min(0.1, (tonumber(first[2]) - now) / 1e6))
    return 'in_flight ' .. format('%.17g', poll) .. ' ' .. now_s .. ' 0'
  end
end

local base = (h[T] - now) / 1e6
local need, need_h = 0, 0
for k = 1, 3 do
  local rate = RATE[k]
  if rate and (k == 1 or cost[k] > 0) then
    need = max(need, (cost[k] - h[k]) / rate)
    need_h = max(need_h, (min(cost[k], CAP[k]) - h[k]) / rate)
  end
end
local wait = max(cd_rem, base + need)
local wait_h = max(cd_rem, base + need_h)
if wait_h > horizon then
  return 'horizon ' .. format('%.17g', max(wait_h - horizon, MIN_RETRY_S)) .. ' ' .. now_s
         .. ' 0'
end

-- Tokens are spent at the send time s, not now: headroom that would overflow the capacity
-- before then is not ours to hand out (else a request held back by one dimension would
-- bunch up with later ones in the others). A request costlier than the capacity absorbs
-- all refill until it goes (its level is then 0).
-- The send is also noted on the send-side view, and the level it finds there in the peak
-- ring (peak()); a send planned before the latest one only lowers those levels.
local ahead = wait - base
local s = now + wait * 1e6
for k = 1, 3 do
  local rate = RATE[k]
  if rate and (k == 1 or cost[k] > 0) then
    local cap = CAP[k]
    local c = min(cost[k], cap)
    h[k] = min(h[k], cap - rate * ahead) - c
    local q = h[SQ + k]
    local v = nil  -- the send-side level this send finds (nil: one planned before the latest)
    if q ~= q then
      v = cap
    elseif s >= q then
      v = min(cap, h[SS + k] + rate * ((s - q) / 1e6))
    end
    if v then
      --#include _peak
      h[SS + k] = v - c; h[SQ + k] = s
    else
      h[SS + k] = h[SS + k] - c
    end
  end
end

local expiry = now + (wait + A[11]) * 1e6
-- The lease set must outlive its latest lease. The bucket keeps the set's expiry (h[LX]), so
-- no PTTL is needed, and the set holds a member '~' at +inf that keeps it from being deleted
-- by the ZREM of its last lease. While h[LX] lies ahead the set is there, with its '~' (a
-- set deleted from outside, e.g. evicted, only has its TTL set again within a minute, below,
-- and nl stays an upper bound); else '~' is added too, and if the set was new (2 members
-- added) it gets its TTL. The TTL is extended only when this lease would outlive it, with a
-- minute of slack so that this is not needed on every call as time moves on.
local new_set = false
if now < h[LX] then
  call('ZADD', KEYS[2], expiry, ARGV[2])
  nl = nl + 1
else
  new_set = call('ZADD', KEYS[2], expiry, ARGV[2], 'inf', '~') == 2
  if new_set then nl = 1 else nl = nl + 1 end
end
local lease_need = expiry + 1e6
if new_set or not (lease_need <= h[LX]) then
  h[LX] = lease_need + 60e6
  call('PEXPIRE', KEYS[2], format('%d', ceil((h[LX] - now) / 1000)))
end

local minute = floor(now / 60e6)
local register = ' 0'
if h[REG] ~= minute then
  register = ' 1'
  h[REG] = minute
  nl = nl - call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
end
h[NL] = nl

--#include _save

if wait > 0 then
  return 'ok ' .. format('%.17g', wait) .. ' ' .. now_s .. register
end
return 'ok 0 ' .. now_s .. register
