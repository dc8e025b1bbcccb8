-- cooldown.lua: a 429 said "retry after R seconds". Prepended with _lib.lua
-- (KEYS[1..5] and A[1..6] = ARGV[1] are described there).
-- A[7] retry_after_s   A[8] stats_window_s
-- cooldown_until = max(current, now + R). Every bucket of the scope is emptied (levels
-- above 0 drop to 0, debts stay) and frozen until cooldown_until, so after it traffic
-- resumes at the refill rate instead of in a burst. Counts a 429. Returns seconds left.

local now = clock()
local st = load(now, call('GET', KEYS[1]))
st.cd = max(st.cd, now + A[7] * 1e6)
for k = 1, 3 do
  local d = st.dims[k]
  if d then
    d.level = min(d.level, 0)
    if not d.q or st.cd >= d.q then
      d.S = min(ceiling({t = st.cd}, d), 0); d.q = st.cd
      peak(d, st.cd, d.S)
    else
      d.S = min(d.S, d.rate * ((d.q - st.cd) / 1e6))
    end
  end
end
st.t = max(st.t, st.cd)
save(st)
stat_add(A[8], now, floor(now / 1e6), 'n429', 1)
return fmt((st.cd - now) / 1e6)
