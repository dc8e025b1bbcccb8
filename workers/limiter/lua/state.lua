-- state.lua: read-only view of a scope, levels brought to now. Prepended with _head.lua
-- and _lib.lua (KEYS[1..5] and A[1..6] = ARGV[1] are described in _head.lua; limits
-- -1 = the ones stored by the last write).
-- Returns {now_us, cooldown_s, leases, t_us, burst_s,
--          then per dimension: limit/min, capacity, level ('' when not limited),
--          then learned raw limits r, i, o ('' when absent)}

local now = clock()
local h = load(now, call('GET', KEYS[1]))
local out = {fmt(now), fmt(max(0, (h[CD] - now) / 1e6)),
             call('ZCOUNT', KEYS[2], '(' .. fmt(now), '(+inf'),
             fmt(h[T]), fmt(h[BURST])}
for k = 1, 3 do
  if RATE[k] then
    out[#out + 1] = fmt(h[LIM + k]); out[#out + 1] = fmt(CAP[k]); out[#out + 1] = fmt(h[k])
  else
    out[#out + 1] = ''; out[#out + 1] = ''; out[#out + 1] = ''
  end
end
local learned = call('HMGET', KEYS[3], 'r', 'i', 'o')
for k = 1, 3 do out[#out + 1] = learned[k] or '' end
return out
