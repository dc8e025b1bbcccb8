-- state.lua: read-only view of a scope, levels brought to now. Prepended with _lib.lua.
-- KEYS[1] bucket  KEYS[2] leases  KEYS[3] learned  KEYS[4] stats  KEYS[5] statidx
-- ARGV[1..3] limits/min ('*' = the ones stored by the last write)   ARGV[4] burst_s
-- ARGV[5] learned util   ARGV[6] now_us override, EMPTY IN PRODUCTION
-- Returns {now_us, cooldown_s, leases, t_us, burst_s,
--          then per dimension: limit/min, capacity, level ('' when not limited),
--          then learned raw limits r, i, o ('' when absent)}

local now = clock()
local st = load(now)
local out = {fmt(now), fmt(math.max(0, (st.cd - now) / 1e6)),
             redis.call('ZCOUNT', KEYS[2], '(' .. fmt(now), '+inf'),
             fmt(st.t), fmt(st.burst or 0)}
for k = 1, 3 do
  local d = st.dims[k]
  if d then
    out[#out + 1] = fmt(d.lim); out[#out + 1] = fmt(d.cap); out[#out + 1] = fmt(d.level)
  else
    out[#out + 1] = ''; out[#out + 1] = ''; out[#out + 1] = ''
  end
end
local learned = redis.call('HMGET', KEYS[3], 'r', 'i', 'o')
for k = 1, 3 do out[#out + 1] = learned[k] or '' end
return out
