-- pool_disable.lua: take one key of a pool out of every acquire (a 401/403 said it is dead).
-- KEYS[1]  the pool's disabled keys (hash alias -> until, us)
-- KEYS[2]  why (hash alias -> "<second>|<why>")
-- ARGV[1]  {alias, for_s: for how long (0 = until enabled again), why (no secret)}
-- Returns 1 when this call disabled it, 0 when it already was (so one line is logged).

local until_us = tonumber(redis.call('HGET', KEYS[1], A.alias) or '0')
if until_us > now then return 0 end
until_us = A.for_s > 0 and now + A.for_s * 1e6 or 1e300
redis.call('HSET', KEYS[1], A.alias, num(until_us))
redis.call('HSET', KEYS[2], A.alias, string.format('%d', math.floor(now / 1e6)) .. '|' .. A.why)
-- Operator state, kept a month unless changed (a disabled key stays so until enabled).
for k = 1, 2 do redis.call('PEXPIRE', KEYS[k], 30 * 86400 * 1000) end
return 1
