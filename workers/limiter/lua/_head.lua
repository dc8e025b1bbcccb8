-- _head.lua: what every scope script starts with (workers/limiter.py prepends it to acquire,
-- settle, cooldown, sync, state and record before they are registered; all but acquire get
-- _lib.lua's helpers next). Not a script of its own. No functions here: in a script, every
-- function is a new closure on every call, which acquire, the hot path, does without.
--
-- Every scope script uses the same KEYS layout (all keys share the scope's hash tag):
--   KEYS[1] bucket  string ({prefix}:{scope}:bs), NREC = 58 little-endian doubles (NaN =
--                   absent), read with one GET and written with one SET (a hash cost ~15 us
--                   more per call in HMGET, HSET and number formatting). The scripts work
--                   on it as the flat array it unpacks to (_load.lua): a table
--                   per dimension cost more to build and write back than the decision.
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
--                   [58] nl = members of KEYS[2] other than '~' (live or expired leases): an
--                       upper bound of the live ones, so acquire counts the set only when it
--                       reaches max_in_flight (see acquire.lua)
--                   Shorter records (18 or 57 doubles, written by earlier versions) load with
--                   the missing fields absent.
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
local NREC = 58
-- The record's fields (h[...]): per dimension k = 1..3, level h[k], limit h[LIM + k],
-- send-side level h[SS + k] and time h[SQ + k], and from o = RING[k] its ring: h[o] =
-- latest window n, h[o + i] (i = 1..NW) the maxima.
local T, CD, LIM, BURST, REG, SS, SQ, X, LX, NL = 4, 5, 5, 9, 10, 10, 13, 17, 18, 58
local RING = {19, 20 + NW, 21 + 2 * NW}
local REC = '<dddddddddddddddddddddddddddddddddddddddddddddddddddddddddd'  -- NREC x 'd'
local NEG = -math.huge
local NAN = 0 / 0
local MARGIN_S = 5
local TTL_SLACK_US = 60e6
-- Per dimension, filled by load(): refill rate per second and capacity; nil = not limited.
local RATE, CAP = {}, {}
