-- _bucket.lua: a scope's buckets (the bucket, leases, learned and share keys, _lib.lua) and
-- the GCRA arithmetic on them. A dimension's bucket holds capacity = limit / 60 x burst_s.
-- The scripts count in time: per = us of refill per unit, burst = us of refill the bucket
-- holds; level(t) = capacity - (tat - t) / per.

-- The share hash: "<d>.<name>" (e.g. "r.share", "i.t0") per dimension d, and "lt".
local function load_share(key)
  local s = {}
  for _, d in ipairs(DIMS) do s[d] = {share = 1} end
  for field, value in pairs(hash(key)) do
    local d, name = string.match(field, '^(%a)%.(.+)$')
    if d then s[d][name] = value else s[field] = value end
  end
  return s
end

-- Kept a minute past its last write: the share a key's other user left, a minute ago, is
-- whole again by now (see _share.lua).
local function save_share(key, s)
  local set = {}
  for _, d in ipairs(DIMS) do
    for name, value in pairs(s[d]) do
      if name ~= 'share' or value ~= 1 then put(set, d .. '.' .. name, value) end
    end
  end
  if s.lt then put(set, 'lt', s.lt) end
  redis.call('DEL', key)
  if #set > 0 then redis.call('HSET', key, unpack(set)); redis.call('PEXPIRE', key, 65000) end
end

local function set_limit(b, d, lim)
  b.per[d], b.cap[d] = 60e6 / lim, lim / 60 * b.burst_s
end

-- The bucket brought to `now`, per limited dimension d: tat[d] (>= now), and per[d], cap[d]
-- of the limit base[d] (the limit `limits` gives, or the last write's) x our share of the key
-- when learning it (b.sh, the share hash, read then and with the last write's limits).
local function load(keys, limits)
  local f, stored = hash(keys.bucket), limits == nil
  limits = limits or {per_min = {}}
  local burst_s = (stored and f.burst or limits.burst_s) or 1
  local b = {keys = keys, tat = {}, per = {}, cap = {}, base = {}, burst_s = burst_s,
             tw = (stored and f.tw or limits.tw) or 1,
             burst = burst_s * 1e6, cd = f.cd or 0, lx = f.lx or 0, ls = f.ls or 0,
             so = f.so or 0, st = f.st or 0, sr = f.sr or 0, si = f.si or 0,
             ar = f.ar or 0, ai = f.ai or 0, lu = (stored and f.lu or limits.learned_utilization) or 1,
             learning = limits.learn_share == true}
  if stored or b.learning then b.sh = load_share(keys.share) end
  local learned = stored and {} or hash(keys.learned)
  for _, d in ipairs(DIMS) do
    local lim = stored and f['L' .. d] or limits.per_min[d]
                or learned[d] and learned[d] * limits.learned_utilization
    if lim and lim > 0 then
      b.base[d] = lim
      local rate = b.sh and lim * b.sh[d].share or lim
      -- A bucket of less than one request (paced_scope, _lib.lua) is planned at the
      -- provider's full rate: its sends are paced on the last one's admission (`ar`), which
      -- is its tolerance; the target's 5 % cost 0.05 s a send there (bench.small_keys --mix)
      if d == 'r' and paced_scope(lim, burst_s) then rate = rate / b.lu end
      set_limit(b, d, rate)
      b.tat[d] = math.max(now, f[d] or now)
    end
  end
  return b
end

-- Write the bucket back, whole (a dimension no longer limited loses its state); it expires
-- once every dimension is full, no cooldown holds and no lease is left (an expired bucket is
-- a full one). The share hash too, if it changed.
local function save(b)
  local set, needed = {}, math.max(b.cd, b.lx, b.so, b.st, b.sr, b.si, b.ar, b.ai)
  put(set, 'burst', b.burst_s); put(set, 'cd', b.cd); put(set, 'lx', b.lx); put(set, 'ls', b.ls)
  put(set, 'so', b.so)
  if b.tw ~= 1 then put(set, 'tw', b.tw) end
  if b.st > 0 then put(set, 'st', b.st) end
  if b.sr > 0 then put(set, 'sr', b.sr) end
  if b.si > 0 then put(set, 'si', b.si) end
  if b.ar > now then put(set, 'ar', b.ar) end
  if b.ai > now then put(set, 'ai', b.ai) end
  if b.lu ~= 1 then put(set, 'lu', b.lu) end
  for d, tat in pairs(b.tat) do
    put(set, d, tat); put(set, 'L' .. d, b.base[d])
    needed = math.max(needed, tat)
  end
  redis.call('DEL', b.keys.bucket)
  redis.call('HSET', b.keys.bucket, unpack(set))
  redis.call('PEXPIRE', b.keys.bucket, string.format('%d', math.ceil((needed - now) / 1000) + 5000))
  if b.sh and b.sh.changed then save_share(b.keys.share, b.sh) end
end

-- A call's `cost` (per_dim) as bucket b counts it: its tokens dimension weighs each output
-- token b.tw times (Bedrock counts input + 5 x output against one tokens quota) and, before
-- the answer is known, takes at least input + the call's max tokens (cost.m), as such a
-- quota does at admission. (Reserving the most an answer may count, input + 5 x max tokens,
-- took a whole 1 s bucket per call: bench.clouds' Bedrock entry served 14% of the calls
-- where its quota was 30%, and still drew a throttle at a load of 7.)
local function costed(b, cost)
  if not b.per.t then return cost end
  local t = cost.i + math.max(b.tw * cost.o, cost.m or 0)
  return {r = cost.r, i = cost.i, o = cost.o, t = t, m = cost.m}
end

-- The earliest send from `send` on at which every limited dimension with a cost (requests
-- always: theirs is 1) holds it, reservations already made included; and `judged`, the same
-- with each cost capped at the bucket's capacity, for the horizon (so an oversized request
-- is not refused for ever: it is debited as the capacity but waits for all of it).
local function plan(b, cost, send, judged)
  cost = costed(b, cost)
  for d, per in pairs(b.per) do
    if cost[d] > 0 then
      send = math.max(send, b.tat[d] + cost[d] * per - b.burst)
      judged = math.max(judged, b.tat[d] + math.min(cost[d] * per, b.burst) - b.burst)
    end
  end
  return send, judged
end

-- Debit `cost` for a send at `send` (each tat moves to max(tat, send) + cost x per), take
-- the lease until `expiry` and write the bucket.
local function reserve(b, cost, send, lease, expiry)
  cost = costed(b, cost)
  for d, per in pairs(b.per) do
    if cost[d] > 0 then b.tat[d] = math.max(b.tat[d], send) + math.min(cost[d] * per, b.burst) end
  end
  redis.call('ZADD', b.keys.leases, num(expiry), lease)
  b.lx = math.max(b.lx, expiry)
  redis.call('PEXPIRE', b.keys.leases, string.format('%d', math.ceil((b.lx - now) / 1000) + 1000))
  save(b)
end

-- nil while fewer than max_in_flight leases live (nil: no cap), else the seconds after which
-- to look again (the first lease's expiry, between 5 and 100 ms).
local function leases_full(keys, max_in_flight)
  if not max_in_flight then return nil end
  redis.call('ZREMRANGEBYSCORE', keys.leases, '-inf', num(now))  -- leases of dead workers
  if redis.call('ZCARD', keys.leases) < max_in_flight then return nil end
  local first = redis.call('ZRANGE', keys.leases, 0, 0, 'WITHSCORES')
  return math.max(0.005, math.min(0.1, (tonumber(first[2]) - now) / 1e6))
end
