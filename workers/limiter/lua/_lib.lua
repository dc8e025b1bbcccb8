-- _lib.lua: the functions the limiter's scripts share; prepended (after _clock.lua) to each.
--
-- One scope's state, every key under its hash tag {prefix}:{scope}:
--   KEYS[1] bucket  hash  r, i, o: per dimension (requests, input tokens, output tokens) the
--                         theoretical arrival time (GCRA), us of Redis time: the instant its
--                         bucket is full again, all reservations paid. Absent or past = full.
--                         Lr, Li, Lo: the per-minute limits of the last write, before our
--                         share (absent = not limited); burst: burst_s of the last write;
--                         cd: cooldown until (us); lx: latest lease expiry (us);
--                         fr, fi, fo: the share of each limit that is ours (absent =
--                         1; see learn_share); learn_share's two windows per dimension:
--                         the previous one from h (-remaining) at t (us), its calls' use
--                         u and its highest -remaining x; the current one from g at k,
--                         its use v and highest y (hr, tr, ur, xr, gr, kr, vr, yr for
--                         requests, and so on); mr, mi, mo: the highest -remaining seen;
--                         lt: the mean time (us) from a call's send to its settle
--   KEYS[2] leases  zset  lease id -> expiry (us)
--   KEYS[3] learned hash  r, i, o: raw per-minute limits from -limit headers (kept 24 h)
--   KEYS[4] stats   hash  "<second>:<field>" -> count
--   KEYS[5] statidx zset  the seconds present in KEYS[4], to prune old ones
-- Every script gets these five keys. ARGV starts with the limits:
--   ARGV[1..3] per-minute limit of requests, input, output tokens: '' = not configured (the
--              learned limit x ARGV[5] if any, else unlimited), '*' = the one last written
--   ARGV[4]    burst_s ('*' = last written)   ARGV[5] utilisation applied to learned limits
--   ARGV[6]    '1': learn our share of the key from the headers (learn_share), else '0'
-- A dimension's bucket holds capacity = limit / 60 x burst_s. The scripts count in time:
-- per = us of refill per unit, burst = us of refill the bucket holds; level(t) = capacity -
-- (tat - t) / per. Numbers leave the scripts as strings: Redis would truncate them.

-- The functions below work on one scope: KEYS[1..5] and ARGV[1..6] (and the header arguments
-- that follow) as a one-scope script gets them. A pool's script (pool_acquire.lua) works on
-- several scopes in one call and points these two at one scope at a time (use_scope).
local KEYS, ARGV = KEYS, ARGV
local CALL_KEYS = KEYS
local function use_scope(first_key, argv)
  KEYS = {CALL_KEYS[first_key], CALL_KEYS[first_key + 1], CALL_KEYS[first_key + 2],
          CALL_KEYS[first_key + 3], CALL_KEYS[first_key + 4]}
  ARGV = argv
end

local DIMS = {'r', 'i', 'o'}
local STAT_FIELDS = {'requests', 'input_tokens', 'output_tokens', 'waits', 'wait_ms', 'n429',
                     'n529', 'n5xx', 'nconn', 'cache_read', 'cache_write', 'uncached',
                     'short_prefix'}

local function num(x)
  return string.format('%.17g', x)
end

-- The bucket brought to `now`, per limited dimension k: tat[k] (>= now), per[k], cap[k] and
-- lim[k] = base[k] (the limit ARGV gives, or the last write's) x share[k] when learning it.
local FIELDS = {'r', 'i', 'o', 'Lr', 'Li', 'Lo', 'burst', 'cd', 'lx', 'lt'}
-- learn_share's state per dimension: field letter (+ r, i or o) and its name in the bucket
local SHARE_STATE = {{'f', 'share'}, {'h', 'r0'}, {'t', 't0'}, {'u', 'u0'}, {'x', 'x0'},
                     {'g', 'r1'}, {'k', 't1'}, {'v', 'u1'}, {'y', 'x1'}, {'m', 'top'}}
for _, field in ipairs(SHARE_STATE) do
  for k = 1, 3 do table.insert(FIELDS, field[1] .. DIMS[k]) end
end

local function set_limit(b, k, lim)
  b.lim[k], b.per[k], b.cap[k] = lim, 60e6 / lim, lim / 60 * b.burst_s
end

local function load(now)
  local f = redis.call('HMGET', KEYS[1], unpack(FIELDS))
  local burst_s = tonumber(ARGV[4] == '*' and f[7] or ARGV[4]) or 1
  local b = {tat = {}, per = {}, cap = {}, lim = {}, base = {}, burst_s = burst_s,
             burst = burst_s * 1e6, cd = tonumber(f[8]) or 0, lx = tonumber(f[9]) or 0,
             lat = tonumber(f[10]), was = f}
  for i, field in ipairs(SHARE_STATE) do
    b[field[2]] = {}
    for k = 1, 3 do b[field[2]][k] = tonumber(f[7 + 3 * i + k]) end
  end
  local learned = {}
  if ARGV[1] == '' or ARGV[2] == '' or ARGV[3] == '' then
    learned = redis.call('HMGET', KEYS[3], 'r', 'i', 'o')
  end
  for k = 1, 3 do
    local lim
    if ARGV[k] == '*' then lim = tonumber(f[3 + k])
    elseif ARGV[k] ~= '' then lim = tonumber(ARGV[k])
    elseif learned[k] then lim = tonumber(learned[k]) * tonumber(ARGV[5]) end
    b.share[k] = b.share[k] or 1
    if lim and lim > 0 then
      b.base[k] = lim
      set_limit(b, k, (ARGV[6] == '1' or ARGV[k] == '*') and lim * b.share[k] or lim)
      b.tat[k] = math.max(now, tonumber(f[k]) or now)
    end
  end
  return b
end

-- Write the bucket back; it expires once every dimension is full, no cooldown holds and no
-- lease is left (an expired bucket is a full one).
local function save(b, now)
  local set = {'burst', num(b.burst_s), 'cd', num(b.cd), 'lx', num(b.lx)}
  local gone = {}
  local needed = math.max(b.cd, b.lx)
  for k = 1, 3 do
    if b.tat[k] then
      table.insert(set, DIMS[k]); table.insert(set, num(b.tat[k]))
      table.insert(set, 'L' .. DIMS[k]); table.insert(set, num(b.base[k]))
      needed = math.max(needed, b.tat[k])
    elseif b.was[k] or b.was[3 + k] then  -- no longer limited: its state goes
      table.insert(gone, DIMS[k]); table.insert(gone, 'L' .. DIMS[k])
    end
  end
  for k = 1, 3 do  -- what learn_share knows, kept a minute past its last change
    for i, field in ipairs(SHARE_STATE) do
      local value = b[field[2]][k]
      if i == 1 and value == 1 and not b.was[10 + k] then value = nil end  -- a whole share
      if value then
        table.insert(set, field[1] .. DIMS[k]); table.insert(set, num(value))
        needed = math.max(needed, now + 60e6)
      elseif b.was[7 + 3 * i + k] then
        table.insert(gone, field[1] .. DIMS[k])
      end
    end
  end
  if b.lat then table.insert(set, 'lt'); table.insert(set, num(b.lat)) end
  redis.call('HSET', KEYS[1], unpack(set))
  if #gone > 0 then redis.call('HDEL', KEYS[1], unpack(gone)) end
  redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil((needed - now) / 1000) + 5000))
end

-- ARGV[j..j+2]: the -limit headers of r, i, o ('' = absent), kept for 24 h for the
-- dimensions ARGV gives no limit for (a configured limit always wins).
local function learn(j)
  local set = {}
  for k = 1, 3 do
    if ARGV[k] == '' and ARGV[j + k - 1] ~= '' then
      table.insert(set, DIMS[k]); table.insert(set, ARGV[j + k - 1])
    end
  end
  if #set > 0 then
    redis.call('HSET', KEYS[3], unpack(set))
    redis.call('PEXPIRE', KEYS[3], 24 * 3600 * 1000)
  end
end

-- When someone else uses the key too (ARGV[6] = '1'), learn the share of each limit that is
-- ours from ARGV[j..j+2] (-remaining) and ARGV[j+3..j+5] (-limit), over windows. The
-- provider's bucket refills at the rate left for us and loses what it admits of ours, so
-- over a window from the -remaining r0 at t0 to r1 at t1
--     left = (r1 - r0 + what our calls sent in [t0, t1) used) / (the key's limit x (t1 - t0))
-- whether callers queue or not, and at an empty bucket too (all that refilled was then used
-- by us: a 429 refused the rest). A call counts in the window it was sent in (the provider
-- takes its input then), which settle learns only when the call ends: so a window is judged
-- SHARE_LATE mean call times after its end, its late calls in by then (a window lasts 2 s,
-- the headers being rounded, and at least SHARE_CALLS mean call times). The share moves
-- halfway to `left`, down only by more than the estimate's noise (SHARE_NOISE: the calls
-- sent right at a window's ends, the rounding), so a key that is all ours keeps its whole
-- share. A window in which the bucket came near full (it may have wasted refill) gives only
-- a floor: the share climbs by 1/60 per second of it (all the way within a minute once the
-- others stop) or to `left` if higher. At its end, a window on the calls in so far (too
-- few, never too many) is a floor too: it lifts a share that fell too far without waiting.
local SHARE_MIN, SHARE_WINDOW_US, SHARE_CALLS, SHARE_LATE = 0.05, 2e6, 5, 4
local SHARE_GAIN, SHARE_NOISE = 0.5, 0.03
local function judge_window(b, k, limit)
  local left = (b.r1[k] - b.r0[k] + b.u0[k]) / (b.t1[k] - b.t0[k]) / (limit / 60e6)
  local share = b.share[k]
  if b.x0[k] >= 0.9 * b.top[k] then
    share = math.max(share + (b.t1[k] - b.t0[k]) / 60e6, left)
  elseif left > share or left < share - SHARE_NOISE then
    share = share + SHARE_GAIN * (left - share)
  end
  return share
end

local function learn_share(b, j, now)
  if ARGV[6] ~= '1' then return end
  for k = 1, 3 do
    local rem, limit = tonumber(ARGV[j + k - 1]), tonumber(ARGV[j + k + 2])
    if b.per[k] and rem and limit and limit > 0 then
      -- full: the most seen, and at least our own burst's worth of the key's limit
      b.top[k] = math.max(b.top[k] or limit / 60 * b.burst_s, rem)
      if not b.t1[k] or now < b.t1[k] then  -- a first header
        b.r0[k], b.t0[k], b.u0[k], b.x0[k] = nil, nil, nil, nil
        b.r1[k], b.t1[k], b.u1[k], b.x1[k] = rem, now, 0, rem
      else
        local share = b.share[k]
        b.x1[k] = math.max(b.x1[k], rem)
        if b.t0[k] and now - b.t1[k] >= SHARE_LATE * (b.lat or 0) then
          share = judge_window(b, k, limit)
          b.r0[k], b.t0[k], b.u0[k], b.x0[k] = nil, nil, nil, nil
        end
        if now - b.t1[k] >= math.max(SHARE_WINDOW_US, SHARE_CALLS * (b.lat or 0)) then
          share = math.max(share, (rem - b.r1[k] + b.u1[k]) / (now - b.t1[k]) / (limit / 60e6))
          b.r0[k], b.t0[k], b.u0[k], b.x0[k] = b.r1[k], b.t1[k], b.u1[k], b.x1[k]
          b.r1[k], b.t1[k], b.u1[k], b.x1[k] = rem, now, 0, rem
        end
        b.share[k] = math.min(1, math.max(SHARE_MIN, share))
        set_limit(b, k, b.base[k] * b.share[k])
      end
    end
  end
end

-- ARGV[j..j+2]: -remaining headers of r, i, o ('' = absent); they only ever lower a level.
local function lower(b, j, now)
  for k = 1, 3 do
    local remaining = tonumber(ARGV[j + k - 1])
    if b.per[k] and remaining then
      b.tat[k] = math.max(b.tat[k], now + b.burst - remaining * b.per[k])
    end
  end
end

-- Add n to this scope's counter `field` of second `sec`, and prune seconds older than
-- window_s. The index is touched only when a counter is new (once per second and field).
local function stat_add(window_s, now, sec, field, n)
  if n == 0 then return end
  local s = string.format('%d', sec)
  if redis.call('HINCRBY', KEYS[4], s .. ':' .. field, n) ~= n then return end
  if redis.call('ZADD', KEYS[5], sec, s) == 0 then return end
  local cutoff = math.floor(now / 1e6) - window_s
  local old = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', cutoff)
  if #old > 0 then
    local fields = {}
    for _, o in ipairs(old) do
      for _, name in ipairs(STAT_FIELDS) do table.insert(fields, o .. ':' .. name) end
    end
    redis.call('HDEL', KEYS[4], unpack(fields))
    redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', cutoff)
  end
  redis.call('PEXPIRE', KEYS[4], (window_s + 60) * 1000)
  redis.call('PEXPIRE', KEYS[5], (window_s + 60) * 1000)
end
