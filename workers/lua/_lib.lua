-- _lib.lua: shared helpers, prepended by workers/limiter.py to acquire, settle, cooldown,
-- sync, state and record before they are registered. Not a script of its own: no KEYS/ARGV.
--
-- Every scope script uses the same KEYS layout (all keys share the scope's hash tag):
--   KEYS[1] bucket  hash  r,i,o = levels (requests, input tokens, output tokens) at time t;
--                         t = us of the levels (may lie in the future while a cooldown
--                         freezes refill); cd = cooldown_until us; Lr,Li,Lo,b = effective
--                         per-minute limits and burst_s last used (for release/state);
--                         reg = minute the scope was last put into the scope registry;
--                         sr,si,so / qr,qi,qo = per dimension, the bucket as the sends see
--                         it: level S right after the latest send q (us). Refunds never
--                         lift a level above what that allows, so a refund cannot slot a
--                         new request in next to one already queued.
--   KEYS[2] leases  zset  member = lease id, score = expiry us
--   KEYS[3] learned hash  r,i,o = raw per-minute limits from -limit headers
--   KEYS[4] stats   hash  "<second>:<field>" -> count
--   KEYS[5] statidx zset  seconds present in KEYS[4] (to prune the old ones)
-- and the same first six ARGV:
--   ARGV[1..3] per-minute limit of requests / input tokens / output tokens:
--              number = configured; '' = not configured (use the learned limit x ARGV[5]
--              if any, else unlimited); '*' = use the limit stored in the bucket
--   ARGV[4]    burst_s ('*' = stored)
--   ARGV[5]    utilisation factor applied to learned limits
--   ARGV[6]    now_us override: EMPTY IN PRODUCTION (tests only, to drive the clock)
-- Numbers leave the scripts as strings ('%.17g'): Redis truncates Lua numbers to integers.

local DIM = {'r', 'i', 'o'}
local LIMF = {'Lr', 'Li', 'Lo'}
local SF = {'sr', 'si', 'so'}
local QF = {'qr', 'qi', 'qo'}
local STAT_FIELDS = {'requests', 'input_tokens', 'output_tokens', 'waits', 'wait_ms', 'n429', 'n529'}
local MARGIN_S = 5

local function fmt(x)
  return string.format('%.17g', x)
end

local function clock()
  if ARGV[6] ~= nil and ARGV[6] ~= '' then
    return tonumber(ARGV[6])
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Load the bucket and bring it to `now` (continuous refill, capped at capacity).
-- Returns st = {now, t, cd, reg, burst, dims[k] = {lim, rate, cap, level} or false}
local function load(now)
  local h = redis.call('HMGET', KEYS[1], 'r', 'i', 'o', 't', 'cd', 'Lr', 'Li', 'Lo', 'b', 'reg',
                       'sr', 'si', 'so', 'qr', 'qi', 'qo')
  local learned = nil
  if ARGV[1] == '' or ARGV[2] == '' or ARGV[3] == '' then
    learned = redis.call('HMGET', KEYS[3], 'r', 'i', 'o')
  end
  local burst = tonumber(ARGV[4])
  if ARGV[4] == '*' then burst = tonumber(h[9]) or 1 end
  local util = tonumber(ARGV[5]) or 1
  local t = tonumber(h[4]) or now
  local st = {now = now, t = math.max(t, now), cd = tonumber(h[5]) or 0,
              reg = h[10], burst = burst, dims = {}, had = {}}
  for k = 1, 3 do
    local lim = nil
    if ARGV[k] == '*' then
      lim = tonumber(h[5 + k])
    elseif ARGV[k] ~= '' then
      lim = tonumber(ARGV[k])
    elseif learned and learned[k] then
      lim = tonumber(learned[k]) * util
    end
    st.had[k] = h[k] ~= false
    if lim and lim > 0 then
      local rate = lim / 60
      local cap = rate * burst
      local level = tonumber(h[k])
      if level == nil then
        level = cap
      elseif now > t then
        level = math.min(cap, level + rate * ((now - t) / 1e6))
      else
        level = math.min(cap, level)
      end
      st.dims[k] = {lim = lim, rate = rate, cap = cap, level = level,
                    S = tonumber(h[10 + k]), q = tonumber(h[13 + k])}
    else
      st.dims[k] = false
    end
  end
  return st
end

-- Write the bucket back; its TTL is long enough that an expired bucket would be full anyway.
local function save(st)
  local ttl = (st.t - st.now) / 1e6
  local args = {'t', fmt(st.t), 'b', fmt(st.burst)}
  for k = 1, 3 do
    local d = st.dims[k]
    if d then
      args[#args + 1] = DIM[k]; args[#args + 1] = fmt(d.level)
      args[#args + 1] = LIMF[k]; args[#args + 1] = fmt(d.lim)
      ttl = math.max(ttl, (st.t - st.now) / 1e6 + (d.cap - d.level) / d.rate)
      if d.q then
        args[#args + 1] = SF[k]; args[#args + 1] = fmt(d.S)
        args[#args + 1] = QF[k]; args[#args + 1] = fmt(d.q)
        ttl = math.max(ttl, (d.q - st.now) / 1e6 + (d.cap - d.S) / d.rate)
      end
    elseif st.had[k] then
      redis.call('HDEL', KEYS[1], DIM[k], LIMF[k], SF[k], QF[k])
    end
  end
  ttl = math.max(ttl, (st.cd - st.now) / 1e6)
  redis.call('HSET', KEYS[1], unpack(args))
  redis.call('PEXPIRE', KEYS[1], math.ceil((ttl + MARGIN_S) * 1000))
end

-- Add n to a per-second counter; prune seconds older than the stats window.
local function stat_add(window_s, now, sec, field, n)
  if n == 0 then return end
  local s = string.format('%d', sec)
  redis.call('HINCRBY', KEYS[4], s .. ':' .. field, n)
  if redis.call('ZADD', KEYS[5], sec, s) == 1 then
    local cutoff = math.floor(now / 1e6) - window_s
    local old = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', cutoff)
    if #old > 0 then
      local f = {}
      for _, o in ipairs(old) do
        for _, name in ipairs(STAT_FIELDS) do f[#f + 1] = o .. ':' .. name end
      end
      redis.call('HDEL', KEYS[4], unpack(f))
      redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', cutoff)
    end
    local ms = (window_s + 60) * 1000
    redis.call('PEXPIRE', KEYS[4], ms)
    redis.call('PEXPIRE', KEYS[5], ms)
  end
end

-- The highest level a refund may restore at st.t: what the send-side bucket allows.
local function ceiling(st, d)
  if not d.q then return d.cap end
  return math.min(d.cap, d.S + d.rate * ((st.t - d.q) / 1e6))
end

-- True up dimension k by -delta for a request sent at s_x (us) that reserved `reserved`.
-- An extra debit (delta > 0) lowers both views of the bucket. A refund (delta < 0) lifts
-- the send-side level by what that send really saved (less what refill clamped at capacity
-- may have absorbed since: at most rate x (q - s_x)), then the level, never above the
-- ceiling.
local function adjust(st, k, delta, s_x, reserved)
  local d = st.dims[k]
  if not d or delta == 0 then return end
  if delta > 0 then
    d.level = d.level - delta
    if d.q then d.S = d.S - delta end
    return
  end
  if d.q then
    local saved = math.min(reserved, d.cap) - math.min(reserved + delta, d.cap)
    if s_x < d.q then saved = math.max(0, saved - d.rate * ((d.q - s_x) / 1e6)) end
    d.S = math.min(d.cap, d.S + saved)
  end
  d.level = math.min(ceiling(st, d), d.level - delta)
end

-- A send of cost c at time s (us) as the send-side bucket sees it.
local function sent(d, s, c)
  c = math.min(c, d.cap)
  if not d.q then
    d.S = d.cap - c; d.q = s
  elseif s >= d.q then
    d.S = math.min(d.cap, d.S + d.rate * ((s - d.q) / 1e6)) - c; d.q = s
  else
    d.S = d.S - c
  end
end
