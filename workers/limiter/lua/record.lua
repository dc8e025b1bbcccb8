-- record.lua: add to this second's usage counters (e.g. n529=1). Prepended with _head.lua
-- and _lib.lua (KEYS[1..5] and A[1..6] = ARGV[1] are described in _head.lua; A[1..5]
-- unused).
-- A[7] stats_window_s   ARGV[2], ARGV[3], ... field, count pairs

local now = clock()
local sec = floor(now / 1e6)
for j = 2, #ARGV, 2 do
  stat_add(A[7], now, sec, ARGV[j], tonumber(ARGV[j + 1]))
end
return 1
