-- usage.lua: a scope's counters of its last N seconds, oldest first.
-- Preamble: _stats
-- KEYS[1..6]  the scope's (see _lib.lua)
-- ARGV[1]     {seconds: N}
-- Returns {first second, then per second one value per STAT_FIELDS entry ('' = 0)}.

local keys, last = scope_keys(1), math.floor(now / 1e6)
local first = last - A.seconds + 1
local out = {string.format('%d', first)}
-- One HMGET per second: unpack() of more than ~8000 values fails, and an hour holds
-- 3600 x 13 fields.
for sec = first, last do
  local values = redis.call('HMGET', keys.stats, unpack(stat_fields(sec)))
  for j = 1, #values do table.insert(out, values[j] or '') end
end
return out
