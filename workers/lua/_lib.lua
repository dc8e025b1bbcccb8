-- _lib.lua: shared helpers, prepended by workers/limiter.py to acquire, settle, cooldown,
-- sync, state and record before they are registered. Not a script of its own.
--
-- Every scope script uses the same KEYS layout (all keys share the scope's hash tag):
--   KEYS[1] bucket  string ({prefix}:{scope}:bs), 18 little-endian doubles (NaN = absent),
--                   read with one GET and written with one SET (a hash cost ~15 us more per
--                   call in HMGET, HSET and number formatting):
--                   [1..3] r,i,o = levels (requests, input tokens, output tokens) at time t
--                   [4] t = us of the levels (may lie in the future while a cooldown
--                       freezes refill)   [5] cd = cooldown_until us
--                   [6..8] Lr,Li,Lo, [9] b = effective per-minute limits and burst_s last
--                       used (for release/state)
--                   [10] reg = minute the scope was last put into the scope registry
--                   [11..13] Sr,Si,So / [14..16] qr,qi,qo = per dimension, the bucket as
--                       the sends see it: level S right after the latest send q (us).
--                       Refunds never lift a level above what that allows, so a refund
--                       cannot slot a new request in next to one already queued.
--                   [17] x = when this key expires (us); [18] lx = when KEYS[2] expires
--                   [19..] per dimension k, 1 + NW doubles from 19 + (k-1)(1+NW): n = the
--                       latest window (of W_US) that holds a send-side level, then a ring
--                       of NW maxima: the highest send-side level in windows n-NW+1..n
--                       (-inf = none), which bounds what a refund may restore (adjust())
--   KEYS[2] leases  zset  member = lease id, score = expiry us; and '~' at +inf, which keeps
--                         the set from being deleted with its last lease (see acquire.lua)
--   KEYS[3] learned hash  r,i,o = raw per-minute limits from -limit headers
--   KEYS[4] stats   hash  "<second>:<field>" -> count
--   KEYS[5] statidx zset  seconds present in KEYS[4] (to prune the old ones)
-- ARGV[1] is a string of little-endian doubles (packed by workers/limiter.py; one argument
-- instead of a dozen saves more in the client's command packing than unpacking costs here),
-- the same first six in every scope script, then the script's own (see each script):
--   A[1..3] per-minute limit of requests / input tokens / output tokens:
--           number = configured; NaN = not configured (use the learned limit x A[5] if
--           any, else unlimited); -1 = use the limit stored in the bucket
--   A[4]    burst_s (-1 = stored)
--   A[5]    utilisation factor applied to learned limits
--   A[6]    now_us override: NaN IN PRODUCTION (tests only, to drive the clock)
-- ARGV[2..] are the script's string arguments (a lease id, counter names).
-- Numbers leave the scripts as strings ('%.17g'): Redis truncates Lua numbers to integers.

-- Library functions as locals: a global lookup per use costs more than the arithmetic.
local max, min, floor, ceil = math.max, math.min, math.floor, math.ceil
local format, call = string.format, redis.call
local pack, unpack_d = nil, nil
if struct then
  pack, unpack_d = struct.pack, struct.unpack
else
  -- fakeredis (the demo's fallback when no redis-server is installed) has no struct library:
  -- the same little-endian IEEE 754 doubles ('<ddd...' formats only) in plain Lua.
  local function enc(x)
    if x ~= x then return '\0\0\0\0\0\0\248\127' end
    local sign, e, m = 0, 0, 0
    if x < 0 or (x == 0 and 1 / x < 0) then sign = 128; x = -x end
    if x == math.huge then
      e = 2047
    elseif x > 0 then
      local f, ex = math.frexp(x)  -- x = f * 2^ex, 0.5 <= f < 1
      if ex > -1022 then
        e, m = ex + 1022, (f * 2 - 1) * 4503599627370496
      else
        m = math.ldexp(f, ex + 1074)
      end
    end
    local b = {}
    for i = 1, 6 do b[i] = m % 256; m = floor(m / 256) end
    b[7] = m + (e % 16) * 16
    b[8] = floor(e / 16) + sign
    return string.char(unpack(b))
  end
  local function dec(s, i)
    local b = {string.byte(s, i, i + 7)}
    local sign = b[8] >= 128 and -1 or 1
    local e = (b[8] % 128) * 16 + floor(b[7] / 16)
    local m = b[7] % 16
    for j = 6, 1, -1 do m = m * 256 + b[j] end
    if e == 2047 then
      if m == 0 then return sign * math.huge end
      return 0 / 0
    end
    if e == 0 then return sign * math.ldexp(m, -1074) end
    return sign * math.ldexp(m + 4503599627370496, e - 1075)
  end
  pack = function(_, ...)
    local out = {}
    for i = 1, select('#', ...) do out[i] = enc((select(i, ...))) end
    return table.concat(out)
  end
  unpack_d = function(fmt, s)
    local out = {}
    for i = 1, #fmt - 1 do out[i] = dec(s, 8 * i - 7) end
    out[#fmt] = 8 * (#fmt - 1) + 1
    return unpack(out)
  end
end

local NA = #ARGV[1] / 8
local A = {unpack_d("<" .. string.rep("d", NA), ARGV[1])}
A[NA + 1] = nil  -- struct.unpack also returns the next position
for j = 1, NA do
  if A[j] ~= A[j] then A[j] = nil end  -- NaN = absent
end
local STORED = -1
-- Send-side peak ring (see adjust() in _true_up.lua): NW windows of W_US each.
local NW, W_US = 12, 250000
local NREC = 18 + 3 * (1 + NW)
local REC = '<' .. string.rep('d', NREC)
local REC18 = '<' .. string.rep('d', 18)
local NEG = -math.huge
local NAN = 0 / 0
local MARGIN_S = 5

local function fmt(x)
  return format('%.17g', x)
end

local function clock()
  local now = A[6]
  if now then return now end
  local t = call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Bring the bucket record `raw` (false when absent) to `now`: continuous refill, capped at
-- capacity. Returns st = {now, t, cd, reg, x, burst, dims[k] = {lim, rate, cap, level, S, q,
-- n, P} or false}.
local function load(now, raw)
  local h = {}
  if raw then
    -- A bucket written before the peak ring (18 doubles) loads without one.
    local ring = #raw >= 8 * NREC
    h = {unpack_d(ring and REC or REC18, raw)}
    for j = 1, 18 do
      if h[j] ~= h[j] then h[j] = nil end
    end
    if not ring then h[19] = nil end  -- unpack's next position
  end
  local learned = nil
  if A[1] == nil or A[2] == nil or A[3] == nil then
    learned = call('HMGET', KEYS[3], 'r', 'i', 'o')
  end
  local burst = A[4]
  if burst == STORED then burst = h[9] or 1 end
  local t = h[4] or now
  local st = {now = now, t = max(t, now), cd = h[5] or 0, reg = h[10], x = h[17],
              lx = h[18], burst = burst, dims = {}}
  for k = 1, 3 do
    local lim = A[k]
    if lim == STORED then
      lim = h[5 + k]
    elseif lim == nil and learned and learned[k] then
      lim = tonumber(learned[k]) * A[5]
    end
    if lim and lim > 0 then
      local rate = lim / 60
      local cap = rate * burst
      local level = h[k]
      if level == nil then
        level = cap
      elseif now > t then
        level = min(cap, level + rate * ((now - t) / 1e6))
      else
        level = min(cap, level)
      end
      local d = {lim = lim, rate = rate, cap = cap, level = level, S = h[10 + k],
                 q = h[13 + k], P = {}}
      local o = 18 + (k - 1) * (1 + NW)
      local n = h[o + 1]
      if n == n and n ~= nil then
        d.n = n
        for i = 1, NW do d.P[i] = h[o + 1 + i] end
      end
      st.dims[k] = d
    else
      st.dims[k] = false
    end
  end
  return st
end

-- The send-side level reached v at time s (us): note it in the window of s. Windows
-- skipped since the latest one get -inf: the level only rose through them (refill) up to
-- v, which the window of s holds, and every query that spans them spans that one too.
-- A time before the latest window counts in the latest (a higher bound is safe).
local function peak(d, s, v)
  local m = floor(s / W_US)
  if d.n == nil or m >= d.n + NW then
    for i = 1, NW do d.P[i] = NEG end
    d.n = m
  elseif m > d.n then
    for j = d.n + 1, m do d.P[j % NW + 1] = NEG end
    d.n = m
  else
    m = d.n
  end
  local i = m % NW + 1
  d.P[i] = max(d.P[i], v)
end

-- The bucket as a record (NREC doubles, NaN = absent).
local function encode(st)
  local v = {NAN, NAN, NAN, st.t, st.cd, NAN, NAN, NAN, st.burst, st.reg or NAN,
             NAN, NAN, NAN, NAN, NAN, NAN, st.x or NAN, st.lx or NAN}
  for j = 19, NREC do v[j] = NAN end
  for k = 1, 3 do
    local d = st.dims[k]
    if d then
      v[k] = d.level; v[5 + k] = d.lim
      if d.q then v[10 + k] = d.S; v[13 + k] = d.q end
      if d.n then
        local o = 18 + (k - 1) * (1 + NW)
        v[o + 1] = d.n
        for i = 1, NW do v[o + 1 + i] = d.P[i] end
      end
    end
  end
  return pack(REC, unpack(v))
end

-- Write the bucket back. Its TTL is only ever extended, with slack, so PEXPIRE runs about
-- once a minute rather than on every call (a longer life is harmless: the state stays
-- exact, an expired bucket would merely have been full).
local TTL_SLACK_US = 60e6
local function save(st)
  -- How long the bucket must live: long enough that an expired bucket would be full
  -- anyway, and as long as the lease set (whose expiry it keeps).
  local need = max(st.t, st.cd, st.lx or 0)
  for k = 1, 3 do
    local d = st.dims[k]
    if d then
      need = max(need, st.t + (d.cap - d.level) / d.rate * 1e6)
      if d.q then need = max(need, d.q + (d.cap - d.S) / d.rate * 1e6) end
    end
  end
  need = need + MARGIN_S * 1e6
  local extend = st.x == nil or need > st.x
  if extend then st.x = need + TTL_SLACK_US end
  call('SET', KEYS[1], encode(st), 'KEEPTTL')
  if extend then
    call('PEXPIRE', KEYS[1], format('%d', ceil((st.x - st.now) / 1000)))
  end
end

-- Add n to a per-second counter; prune seconds older than the stats window. The index is
-- touched only when the counter is new (HINCRBY returned n): once per second and field.
local function stat_add(window_s, now, sec, field, n)
  if n == 0 then return end
  local s = format('%d', sec)
  if call('HINCRBY', KEYS[4], s .. ':' .. field, n) ~= n then return end
  if call('ZADD', KEYS[5], sec, s) == 1 then
    local cutoff = floor(now / 1e6) - window_s
    local old = call('ZRANGEBYSCORE', KEYS[5], '-inf', cutoff)
    if #old > 0 then
      local f = {}
      for _, o in ipairs(old) do
        for _, name in ipairs({'requests', 'input_tokens', 'output_tokens', 'waits', 'wait_ms',
                               'n429', 'n529', 'n5xx', 'nconn'}) do
          f[#f + 1] = o .. ':' .. name
        end
      end
      call('HDEL', KEYS[4], unpack(f))
      call('ZREMRANGEBYSCORE', KEYS[5], '-inf', cutoff)
    end
    local ms = (window_s + 60) * 1000
    call('PEXPIRE', KEYS[4], ms)
    call('PEXPIRE', KEYS[5], ms)
  end
end

