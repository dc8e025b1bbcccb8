-- cooldown.lua: a 429 said "retry after R seconds". KEYS and ARGV[1..6]: see _lib.lua.
-- ARGV[7] R (s)   ARGV[8] stats window_s
-- cooldown_until = max(current, now + R); every bucket of the scope is empty at that instant
-- (tat >= cooldown_until + burst), so traffic resumes at the refill rate, not in a burst.
-- When learning our share of the key (ARGV[6] = '1'), a 429 also cuts it by a tenth.
-- Counts the 429. Returns the seconds left.

local now = now_us()
local b = load(now)
b.cd = math.max(b.cd, now + tonumber(ARGV[7]) * 1e6)
for k = 1, 3 do
  if b.tat[k] then
    b.tat[k] = math.max(b.tat[k], b.cd + b.burst)
    if ARGV[6] == '1' then
      b.share[k] = math.max(SHARE_MIN, b.share[k] * 0.9)
      set_limit(b, k, b.base[k] * b.share[k])
    end
  end
end
save(b, now)
stat_add(tonumber(ARGV[8]), now, math.floor(now / 1e6), 'n429', 1)
return num((b.cd - now) / 1e6)
