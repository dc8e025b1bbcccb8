-- cooldown.lua: a 429 said "retry after R seconds". Prepended with _head.lua
-- and _lib.lua (KEYS[1..5] and A[1..6] = ARGV[1] are described in _head.lua).
-- A[7] retry_after_s   A[8] stats_window_s
-- cooldown_until = max(current, now + R). Every bucket of the scope is emptied (levels
-- above 0 drop to 0, debts stay) and frozen until cooldown_until, so after it traffic
-- resumes at the refill rate instead of in a burst. Counts a 429. Returns seconds left.

local now = clock()
local h = load(now, call('GET', KEYS[1]))
local cd = max(h[CD], now + A[7] * 1e6)
h[CD] = cd
for k = 1, 3 do
  if RATE[k] then
    h[k] = min(h[k], 0)
    local q = h[SQ + k]
    if q ~= q or cd >= q then
      local s = min(ceiling(h, k, cd), 0)
      h[SS + k] = s; h[SQ + k] = cd
      peak(h, k, cd, s)
    else
      h[SS + k] = min(h[SS + k], RATE[k] * ((q - cd) / 1e6))
    end
  end
end
h[T] = max(h[T], cd)
save(h, now)
stat_add(A[8], now, floor(now / 1e6), 'n429', 1)
return fmt((cd - now) / 1e6)
