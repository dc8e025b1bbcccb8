-- _lib.lua: the functions the limiter's scripts share; prepended (after _clock.lua) to each.
--
-- One scope's state, every key under its hash tag {prefix}:{scope}:
--   KEYS[1] bucket  hash  r, i, o: per dimension (requests, input tokens, output tokens) the
--                         theoretical arrival time (GCRA), us of Redis time: the instant its
--                         bucket is full again, all reservations paid. Absent or past = full.
--                         Lr, Li, Lo: the per-minute limits of the last write, before our
--                         share (absent = not limited); burst: burst_s of the last write;
--                         cd: cooldown until (us); lx: latest lease expiry (us);
--                         fr, fi, fo: the share of each limit
--                         that is ours (absent = 1; see learn_share); hr/tr, hi/ti, ho/to:
--                         the -remaining header and its time (us) a share window began at;
--                         xr, xi, xo: the highest -remaining in that window, ur, ui, uo:
--                         what our calls used in it; mr, mi, mo: the highest -remaining
--                         seen; wr, wi, wo: when learning began (us); lt: the mean time
--                         (us) from a call's send to its settle
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

local DIMS = {'r', 'i', 'o'}
local STAT_FIELDS = {'requests', 'input_tokens', 'output_tokens', 'waits', 'wait_ms', 'n429',
                     'n529', 'n5xx', 'nconn'}

local function num(x)
  return string.format('%.17g', x)
end

-- The bucket brought to `now`, per limited dimension k: tat[k] (>= now), per[k], cap[k] and
-- lim[k] = base[k] (the limit ARGV gives, or the last write's) x share[k] when learning it.
local FIELDS = {'r', 'i', 'o', 'Lr', 'Li', 'Lo', 'burst', 'cd', 'lx', 'fr', 'fi', 'fo', 'hr', 'hi',
                'ho', 'tr', 'ti', 'to', 'mr', 'mi', 'mo', 'ur', 'ui', 'uo', 'wr', 'wi', 'wo',
                'xr', 'xi', 'xo', 'lt'}

local function set_limit(b, k, lim)
  b.lim[k], b.per[k], b.cap[k] = lim, 60e6 / lim, lim / 60 * b.burst_s
end

local function load(now)
  local f = redis.call('HMGET', KEYS[1], unpack(FIELDS))
  local burst_s = tonumber(ARGV[4] == '*' and f[7] or ARGV[4]) or 1
  local b = {tat = {}, per = {}, cap = {}, lim = {}, base = {}, share = {}, hr = {}, ht = {},
             top = {}, used = {}, since = {}, hx = {}, burst_s = burst_s, burst = burst_s * 1e6,
             cd = tonumber(f[8]) or 0, lx = tonumber(f[9]) or 0, lat = tonumber(f[31]), was = f}
  local learned = {}
  if ARGV[1] == '' or ARGV[2] == '' or ARGV[3] == '' then
    learned = redis.call('HMGET', KEYS[3], 'r', 'i', 'o')
  end
  for k = 1, 3 do
    local lim
    if ARGV[k] == '*' then lim = tonumber(f[3 + k])
    elseif ARGV[k] ~= '' then lim = tonumber(ARGV[k])
    elseif learned[k] then lim = tonumber(learned[k]) * tonumber(ARGV[5]) end
    b.share[k] = tonumber(f[9 + k]) or 1
    b.hr[k], b.ht[k], b.top[k] = tonumber(f[12 + k]), tonumber(f[15 + k]), tonumber(f[18 + k])
    b.used[k], b.since[k], b.hx[k] = tonumber(f[21 + k]), tonumber(f[24 + k]), tonumber(f[27 + k])
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
    local share = (b.share[k] ~= 1 or b.was[9 + k]) and b.share[k] or nil
    local values = {share, b.hr[k], b.ht[k], b.top[k], b.used[k], b.since[k], b.hx[k]}
    for i = 1, 7 do
      if values[i] then
        table.insert(set, FIELDS[6 + 3 * i + k]); table.insert(set, num(values[i]))
        needed = math.max(needed, now + 60e6)
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
-- provider's bucket refills at the rate left for us and loses what it admits of ours, which
-- settle counts (`used`: calls sent since learning began, so the first window leaves out
-- the calls its first -remaining already shows), hence what is left for us is
--     left = (remaining now - remaining then + used) / (the key's limit x the window)
-- whether callers queue or not, and at an empty bucket too (all that refilled was then used
-- by us: a 429 refused the rest). The share moves halfway there per window (calls settle out
-- of order, the headers are rounded). Two windows give only a floor:
-- one in which the bucket came near full (it may have wasted refill), where the share climbs
-- by 1/60 per second (all the way within a minute once the others stop) or to `left` if
-- higher; and the first, whose `used` misses the calls still in flight at its end (later
-- windows count as many from before their start), where the share only rises to `left`.
-- Counting calls as they settle moves those in flight at a window's end into the next, so a
-- window lasts at least SHARE_CALLS mean call times (and 2 s: the headers are rounded).
local SHARE_MIN, SHARE_WINDOW_US, SHARE_CALLS, SHARE_GAIN = 0.05, 2e6, 5, 0.5
local function learn_share(b, j, now)
  if ARGV[6] ~= '1' then return end
  for k = 1, 3 do
    local rem, limit = tonumber(ARGV[j + k - 1]), tonumber(ARGV[j + k + 2])
    if b.per[k] and rem and limit and limit > 0 then
      -- full: the most seen, and at least our own burst's worth of the key's limit
      b.top[k] = math.max(b.top[k] or limit / 60 * b.burst_s, rem)
      local t0, r0 = b.ht[k], b.hr[k]
      if not t0 or not r0 or not b.since[k] or now < t0 then
        b.hr[k], b.ht[k], b.hx[k], b.used[k], b.since[k] = rem, now, rem, 0, now
      else
        b.hx[k] = math.max(b.hx[k] or rem, rem)
        if now - t0 >= math.max(SHARE_WINDOW_US, SHARE_CALLS * (b.lat or 0)) then
          local left = (rem - r0 + (b.used[k] or 0)) / (now - t0) / (limit / 60e6)
          local share = b.share[k] + SHARE_GAIN * (left - b.share[k])
          if b.hx[k] >= 0.9 * b.top[k] then
            share = math.max(b.share[k] + (now - t0) / 60e6, left)
          elseif t0 == b.since[k] then
            share = math.max(b.share[k], left)
          end
          b.share[k] = math.min(1, math.max(SHARE_MIN, share))
          set_limit(b, k, b.base[k] * b.share[k])
          b.hr[k], b.ht[k], b.hx[k], b.used[k] = rem, now, rem, 0
        end
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
