-- _stats.lua: a scope's per-second counters (the stats and statidx keys, _lib.lua). Their
-- names, STAT_FIELDS, are _scopes.py's list, which _scripts.py prepends to every script.

-- The fields of second `sec` in the stats hash, one per counter, in STAT_FIELDS' order.
local function stat_fields(sec)
  local fields = {}
  for j, name in ipairs(STAT_FIELDS) do fields[j] = string.format('%d:', sec) .. name end
  return fields
end

-- Add `counts` (name -> n) to the scope's counters of second `sec`, and prune the seconds
-- older than the stats window (A.stats_window_s). The index is touched only when a counter
-- is new (once per second).
local function stat_add(keys, sec, counts)
  local s, new, window_s = string.format('%d', sec), false, A.stats_window_s
  for field, n in pairs(counts) do
    if n ~= 0 and redis.call('HINCRBY', keys.stats, s .. ':' .. field, n) == n then new = true end
  end
  if not new or redis.call('ZADD', keys.statidx, sec, s) == 0 then return end
  local cutoff = math.floor(now / 1e6) - window_s
  for _, old in ipairs(redis.call('ZRANGEBYSCORE', keys.statidx, '-inf', cutoff)) do
    redis.call('HDEL', keys.stats, unpack(stat_fields(old)))
  end
  redis.call('ZREMRANGEBYSCORE', keys.statidx, '-inf', cutoff)
  redis.call('PEXPIRE', keys.stats, (window_s + 60) * 1000)
  redis.call('PEXPIRE', keys.statidx, (window_s + 60) * 1000)
end
