-- scopes.lua: register a scope and/or list the scopes seen recently.
-- KEYS[1] the registry zset {prefix}:scopes: scope -> last second seen. It names many scopes,
--         so it has a key of its own, only ever touched alone (fine on Redis Cluster).
-- ARGV[1] scope to register ('' = none: list)   ARGV[2] window_s
-- Returns the scopes seen in the last window_s seconds (nothing when registering).

local sec = math.floor(now_us() / 1e6)
local window = tonumber(ARGV[2])
if ARGV[1] ~= '' then
  redis.call('ZADD', KEYS[1], sec, ARGV[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', sec - window)
  redis.call('PEXPIRE', KEYS[1], (window + 60) * 1000)
  return {}
end
return redis.call('ZRANGEBYSCORE', KEYS[1], sec - window, '+inf')
