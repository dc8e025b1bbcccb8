-- record.lua: add to this second's counters of a scope (e.g. a 529). KEYS: see _lib.lua.
-- ARGV[1] stats window_s   ARGV[2..] a count per STAT_FIELDS entry, in its order

local now = now_us()
for j, field in ipairs(STAT_FIELDS) do
  stat_add(tonumber(ARGV[1]), now, math.floor(now / 1e6), field, tonumber(ARGV[j + 1]))
end
return 1
