-- usage.lua: a scope's counters of its last N seconds, oldest first.
-- Preamble: _stats
-- KEYS[1..6]  the scope's (see _lib.lua)
-- ARGV[1]     {seconds: N}
-- Returns {first second, then per second one value per STAT_FIELDS entry ('' = 0)}.

local keys, last = scope_keys(1), math.floor(now / 1e6)
local first, fields = last - A.seconds + 1, {}
for sec = first, last do
  for _, name in ipairs(STAT_FIELDS) do table.insert(fields, string.format('%d:', sec) .. name) end
end
local out = {string.format('%d', first)}
-- In slices: unpack() of more than ~8000 values fails, and an hour holds 3600 x 9 fields.
for i = 1, #fields, 4000 do
  local values = redis.call('HMGET', keys.stats, unpack(fields, i, math.min(i + 3999, #fields)))
  for j = 1, #values do table.insert(out, values[j] or '') end
end
return out
