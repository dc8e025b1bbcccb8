-- scopes.lua: put a scope into (ARGV[1] ~= '') and/or list the registry of recent scopes.
-- Stand-alone; the registry is one key of its own (it names many scopes, so it cannot share
-- their hash tag; it is only ever touched alone, so this is fine on Redis Cluster).
-- KEYS[1] registry zset {prefix}:scopes, member = scope, score = last seen second
-- ARGV[1] scope to register ('' = none)   ARGV[2] window_s
-- ARGV[3] now_us override, EMPTY IN PRODUCTION
-- Returns the scopes seen in the last window_s seconds (after pruning older ones).

local now
if ARGV[3] ~= '' then now = tonumber(ARGV[3]) else
  local t = redis.call('TIME'); now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local sec = math.floor(now / 1e6)
local window = tonumber(ARGV[2])
if ARGV[1] ~= '' then
  redis.call('ZADD', KEYS[1], sec, ARGV[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', sec - window)
  redis.call('PEXPIRE', KEYS[1], (window + 60) * 1000)
  return {}
end
return redis.call('ZRANGEBYSCORE', KEYS[1], sec - window, '+inf')
