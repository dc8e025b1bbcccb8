-- _stats.lua: a scope's per-second counters (the stats and statidx keys, _lib.lua).

-- The counter names, in the order of STAT_FIELDS in _scopes.py.
local STAT_FIELDS = {'requests', 'input_tokens', 'output_tokens', 'waits', 'wait_ms',
                     'cache_read', 'cache_write', 'uncached', 'short_prefix', 'streamed',
                     'ttft_ms', 'gen_ms', 'gen_tokens'}

-- Add `counts` (name -> n) to the scope's counters of second `sec`, and prune seconds older
-- than window_s. The index is touched only when a counter is new (once per second).
local function stat_add(keys, window_s, sec, counts)
  local s, new = string.format('%d', sec), false
  for field, n in pairs(counts) do
    if n ~= 0 and redis.call('HINCRBY', keys.stats, s .. ':' .. field, n) == n then new = true end
  end
  if not new or redis.call('ZADD', keys.statidx, sec, s) == 0 then return end
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
