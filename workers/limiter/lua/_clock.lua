-- _clock.lua: now_us(), Redis' own clock in microseconds: the only time the limiter uses.
-- Prepended to every script, before _lib.lua. (A limiter built with an injected clock, for
-- tests, prepends a now_us() that reads the time from its last argument instead.)
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
