-- record.lua: add to this second's counters of a scope (e.g. the requests of a batch).
-- KEYS[1..6]  the scope's (see _lib.lua)
-- ARGV[1]     {stats_window_s, counts: {STAT_FIELDS name = count}}

local now = now_us()
local keys = scope_keys(1)
for field, n in pairs(A.counts) do
  stat_add(keys, A.stats_window_s, now, math.floor(now / 1e6), field, n)
end
return 1
