-- state.lua: a read-only view of a scope at now.
-- Preamble: _bucket
-- KEYS[1..6]  the scope's (see _lib.lua)
-- ARGV[1]     {limits (absent: the last write's)}
-- Returns JSON: {now_us, cooldown_s, leases (live), burst_s, learned = {d = the learned raw
-- limit}, and per limited dimension d = {limit_per_min (before our share), capacity,
-- level, share (ours of the key)}}, every number a string.

local b = load(scope_keys(1), A.limits)
local out = {now_us = num(now), cooldown_s = num(math.max(0, b.cd - now) / 1e6),
             leases = redis.call('ZCOUNT', b.keys.leases, '(' .. num(now), '+inf'),
             burst_s = num(b.burst_s), learned = {}}
for d, learned in pairs(hash(b.keys.learned)) do out.learned[d] = num(learned) end
for d, per in pairs(b.per) do
  out[d] = {limit_per_min = num(b.base[d]), capacity = num(b.cap[d]),
            level = num(b.cap[d] - (b.tat[d] - now) / per),
            share = num(b.sh and b.sh[d].share or 1)}
end
return cjson.encode(out)
