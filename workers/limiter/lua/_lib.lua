-- _lib.lua: a scope's state in Redis and the GCRA arithmetic on it; prepended (after
-- _clock.lua, before _share.lua) to every script.
--
-- One scope's keys, in the order LimiterCore.keys() lists them, all under its hash tag
-- {prefix}:{scope}:
--   bucket  hash  r, i, o: per dimension (requests, input tokens, output tokens) the
--                 theoretical arrival time (GCRA), us of Redis time: the instant its bucket is
--                 full again, all reservations paid. Absent or past = full. Lr, Li, Lo: the
--                 per-minute limits of the last write, before our share (absent = not
--                 limited); burst: burst_s of the last write; cd: cooldown until (us);
--                 lx: the latest lease expiry (us)
--   leases  zset  lease id -> expiry (us)
--   learned hash  r, i, o: raw per-minute limits from -limit headers (kept 24 h)
--   stats   hash  "<second>:<field>" -> count (STAT_FIELDS)
--   statidx zset  the seconds present in stats, to prune old ones
--   share   hash  what learn_share knows of our share of the key (see _share.lua)
--
-- ARGV[1] is each script's one JSON argument (ARGV[2], with a test clock, the time). A
-- script on a scope has in it
--   limits   {rpm, itpm, otpm: per-minute limits (absent = not configured: the learned limit
--            x learned_utilization if any, else unlimited), burst_s, learned_utilization,
--            learn_share: learn our share of the key from the headers (see _share.lua)};
--            absent = the limits of the last write (release, state)
--   headers  {remaining = {r, i, o}, limit = {r, i, o}}: a response's -remaining and -limit
--            headers, each absent where the response had none
-- A dimension's bucket holds capacity = limit / 60 x burst_s. The scripts count in time:
-- per = us of refill per unit, burst = us of refill the bucket holds; level(t) = capacity -
-- (tat - t) / per. Numbers leave the scripts as strings: Redis would truncate them.

local A = cjson.decode(ARGV[1])
local DIMS = {'r', 'i', 'o'}
local DIM = {r = 1, i = 2, o = 3}
local LIMITS = {'rpm', 'itpm', 'otpm'}
local STAT_FIELDS = {'requests', 'input_tokens', 'output_tokens', 'waits', 'wait_ms',
                     'cache_read', 'cache_write', 'uncached', 'short_prefix', 'streamed',
                     'ttft_ms', 'gen_ms', 'gen_tokens'}

local function num(x)
  return string.format('%.17g', x)
end

-- The six keys of the scope whose first key is KEYS[first].
local function scope_keys(first)
  return {bucket = KEYS[first], leases = KEYS[first + 1], learned = KEYS[first + 2],
          stats = KEYS[first + 3], statidx = KEYS[first + 4], share = KEYS[first + 5]}
end

-- The share hash: "<dimension>.<name>" (e.g. "r.share", "i.t0") per dimension and "lt".
local function load_share(key)
  local s = {{}, {}, {}}
  local flat = redis.call('HGETALL', key)
  for j = 1, #flat, 2 do
    local dim, name = string.match(flat[j], '^(%a)%.(.+)$')
    if dim then s[DIM[dim]][name] = tonumber(flat[j + 1]) else s[flat[j]] = tonumber(flat[j + 1]) end
  end
  for k = 1, 3 do s[k].share = s[k].share or 1 end
  return s
end

-- Kept a minute past its last write: the share a key's other user left, a minute ago, is
-- whole again by now (see _share.lua).
local function save_share(key, s)
  local set = {}
  for k = 1, 3 do
    for name, value in pairs(s[k]) do
      if name ~= 'share' or value ~= 1 then
        table.insert(set, DIMS[k] .. '.' .. name); table.insert(set, num(value))
      end
    end
  end
  if s.lt then table.insert(set, 'lt'); table.insert(set, num(s.lt)) end
  redis.call('DEL', key)
  if #set > 0 then
    redis.call('HSET', key, unpack(set))
    redis.call('PEXPIRE', key, 65000)
  end
end

local function set_limit(b, k, lim)
  b.lim[k], b.per[k], b.cap[k] = lim, 60e6 / lim, lim / 60 * b.burst_s
end

-- The bucket brought to `now`, per limited dimension k: tat[k] (>= now), per[k], cap[k] and
-- lim[k] = base[k] (the limit `limits` gives, or the last write's) x our share of the key
-- when learning it (b.sh, the share hash, read then and with the last write's limits).
local function load(keys, limits, now)
  local f = redis.call('HMGET', keys.bucket, 'r', 'i', 'o', 'Lr', 'Li', 'Lo', 'burst', 'cd', 'lx')
  local stored = limits == nil
  limits = limits or {}
  local burst_s = tonumber(stored and f[7] or limits.burst_s) or 1
  local b = {keys = keys, tat = {}, per = {}, cap = {}, lim = {}, base = {}, burst_s = burst_s,
             burst = burst_s * 1e6, cd = tonumber(f[8]) or 0, lx = tonumber(f[9]) or 0,
             learning = limits.learn_share == true, was = f}
  if stored or b.learning then b.sh = load_share(keys.share) end
  local learned = {}
  if not stored and not (limits.rpm and limits.itpm and limits.otpm) then
    learned = redis.call('HMGET', keys.learned, 'r', 'i', 'o')
  end
  for k = 1, 3 do
    local lim
    if stored then lim = tonumber(f[3 + k])
    elseif limits[LIMITS[k]] then lim = limits[LIMITS[k]]
    elseif learned[k] then lim = tonumber(learned[k]) * limits.learned_utilization end
    if lim and lim > 0 then
      b.base[k] = lim
      set_limit(b, k, b.sh and lim * b.sh[k].share or lim)
      b.tat[k] = math.max(now, tonumber(f[k]) or now)
    end
  end
  return b
end

-- Write the bucket back; it expires once every dimension is full, no cooldown holds and no
-- lease is left (an expired bucket is a full one). The share hash too, if it changed.
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
  redis.call('HSET', b.keys.bucket, unpack(set))
  if #gone > 0 then redis.call('HDEL', b.keys.bucket, unpack(gone)) end
  redis.call('PEXPIRE', b.keys.bucket,
             string.format('%d', math.ceil((needed - now) / 1000) + 5000))
  if b.sh and b.sh.changed then save_share(b.keys.share, b.sh) end
end

-- The earliest send from `send` on at which every limited dimension with a cost (requests
-- always) holds it, reservations already made included; and `judged`, the same with each
-- cost capped at the bucket's capacity, for the horizon (so an oversized request is not
-- refused for ever: it is debited as the capacity but waits for all of it).
local function plan(b, cost, send, judged)
  for k = 1, 3 do
    if b.per[k] and (k == 1 or cost[k] > 0) then
      send = math.max(send, b.tat[k] + cost[k] * b.per[k] - b.burst)
      judged = math.max(judged, b.tat[k] + math.min(cost[k] * b.per[k], b.burst) - b.burst)
    end
  end
  return send, judged
end

-- Debit `cost` for a send at `send` (each tat moves to max(tat, send) + cost x per), take
-- the lease until `expiry` and write the bucket.
local function reserve(b, cost, send, lease, expiry, now)
  for k = 1, 3 do
    if b.per[k] and (k == 1 or cost[k] > 0) then
      b.tat[k] = math.max(b.tat[k], send) + math.min(cost[k] * b.per[k], b.burst)
    end
  end
  redis.call('ZADD', b.keys.leases, num(expiry), lease)
  b.lx = math.max(b.lx, expiry)
  redis.call('PEXPIRE', b.keys.leases, string.format('%d', math.ceil((b.lx - now) / 1000) + 1000))
  save(b, now)
end

-- nil while fewer than max_in_flight leases live (nil: no cap), else the seconds after which
-- to look again (the first lease's expiry, between 5 and 100 ms).
local function leases_full(keys, max_in_flight, now)
  if not max_in_flight then return nil end
  redis.call('ZREMRANGEBYSCORE', keys.leases, '-inf', num(now))  -- leases of dead workers
  if redis.call('ZCARD', keys.leases) < max_in_flight then return nil end
  local first = redis.call('ZRANGE', keys.leases, 0, 0, 'WITHSCORES')
  return math.max(0.005, math.min(0.1, (tonumber(first[2]) - now) / 1e6))
end

-- The -limit headers, kept for 24 h for the dimensions `limits` gives no limit for (a
-- configured limit always wins).
local function learn(keys, limits, headers)
  local set = {}
  for k = 1, 3 do
    local seen = headers.limit[DIMS[k]]
    if limits[LIMITS[k]] == nil and seen then
      table.insert(set, DIMS[k]); table.insert(set, num(seen))
    end
  end
  if #set > 0 then
    redis.call('HSET', keys.learned, unpack(set))
    redis.call('PEXPIRE', keys.learned, 24 * 3600 * 1000)
  end
end

-- The -remaining headers only ever lower a level.
local function lower(b, headers, now)
  for k = 1, 3 do
    local remaining = headers.remaining[DIMS[k]]
    if b.per[k] and remaining then
      b.tat[k] = math.max(b.tat[k], now + b.burst - remaining * b.per[k])
    end
  end
end

-- Add n to the scope's counter `field` of second `sec`, and prune seconds older than
-- window_s. The index is touched only when a counter is new (once per second and field).
local function stat_add(keys, window_s, now, sec, field, n)
  if n == 0 then return end
  local s = string.format('%d', sec)
  if redis.call('HINCRBY', keys.stats, s .. ':' .. field, n) ~= n then return end
  if redis.call('ZADD', keys.statidx, sec, s) == 0 then return end
  local cutoff = math.floor(now / 1e6) - window_s
  local old = redis.call('ZRANGEBYSCORE', keys.statidx, '-inf', cutoff)
  if #old > 0 then
    local fields = {}
    for _, o in ipairs(old) do
      for _, name in ipairs(STAT_FIELDS) do table.insert(fields, o .. ':' .. name) end
    end
    redis.call('HDEL', keys.stats, unpack(fields))
    redis.call('ZREMRANGEBYSCORE', keys.statidx, '-inf', cutoff)
  end
  redis.call('PEXPIRE', keys.stats, (window_s + 60) * 1000)
  redis.call('PEXPIRE', keys.statidx, (window_s + 60) * 1000)
end
