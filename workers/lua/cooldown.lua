-- cooldown.lua: a 429 said "retry after R seconds". Prepended with _lib.lua.
-- KEYS[1] bucket  KEYS[2] leases  KEYS[3] learned  KEYS[4] stats  KEYS[5] statidx
-- ARGV[1..3] limits/min (requests, input, output)   ARGV[4] burst_s   ARGV[5] learned util
-- ARGV[6] now_us override, EMPTY IN PRODUCTION
-- ARGV[7] retry_after_s   ARGV[8] stats_window_s
-- cooldown_until = max(current, now + R). Every bucket of the scope is emptied (levels
-- above 0 drop to 0, debts stay) and frozen until cooldown_until, so after it traffic
-- resumes at the refill rate instead of in a burst. Counts a 429. Returns seconds left.

local now = clock()
local st = load(now)
st.cd = math.max(st.cd, now + tonumber(ARGV[7]) * 1e6)
for k = 1, 3 do
  local d = st.dims[k]
  if d then
    d.level = math.min(d.level, 0)
    if not d.q or st.cd >= d.q then
      d.S = math.min(ceiling({t = st.cd}, d), 0); d.q = st.cd
    else
      d.S = math.min(d.S, d.rate * ((d.q - st.cd) / 1e6))
    end
  end
end
st.t = math.max(st.t, st.cd)
redis.call('HSET', KEYS[1], 'cd', fmt(st.cd))
save(st)
stat_add(tonumber(ARGV[8]), now, math.floor(now / 1e6), 'n429', 1)
return fmt((st.cd - now) / 1e6)
