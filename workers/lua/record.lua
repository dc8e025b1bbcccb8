-- record.lua: add to this second's usage counters (e.g. n529=1). Prepended with _lib.lua.
-- KEYS[1] bucket  KEYS[2] leases  KEYS[3] learned  KEYS[4] stats  KEYS[5] statidx
-- ARGV[1..5] unused ('')   ARGV[6] now_us override, EMPTY IN PRODUCTION
-- ARGV[7] stats_window_s   ARGV[8], ARGV[9], ... field, count pairs

local now = clock()
local sec = math.floor(now / 1e6)
for j = 8, #ARGV, 2 do
  stat_add(tonumber(ARGV[7]), now, sec, ARGV[j], tonumber(ARGV[j + 1]))
end
return 1
