-- state.lua: a read-only view of a scope at now.
-- KEYS[1..6]  the scope's (see _lib.lua)
-- ARGV[1]     {limits (absent: the last write's)}
-- Returns {now_us, cooldown_s, live leases, burst_s, then per dimension r, i, o: limit per
-- minute (before our share), capacity, level, our share of the key ('' x 4 when not
-- limited), then the learned raw limits r, i, o}.

local now = now_us()
local b = load(scope_keys(1), A.limits, now)
local out = {num(now), num(math.max(0, b.cd - now) / 1e6),
             redis.call('ZCOUNT', b.keys.leases, '(' .. num(now), '+inf'), num(b.burst_s)}
for k = 1, 3 do
  if b.per[k] then
    table.insert(out, num(b.base[k])); table.insert(out, num(b.cap[k]))
    table.insert(out, num(b.cap[k] - (b.tat[k] - now) / b.per[k]))
    table.insert(out, num(b.sh and b.sh[k].share or 1))
  else
    table.insert(out, ''); table.insert(out, ''); table.insert(out, ''); table.insert(out, '')
  end
end
local learned = redis.call('HMGET', b.keys.learned, 'r', 'i', 'o')
for k = 1, 3 do table.insert(out, learned[k] or '') end
return out
