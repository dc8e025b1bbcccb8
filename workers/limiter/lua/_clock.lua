-- _clock.lua: now, Redis' own clock in microseconds, read once at the script's start: the
-- only time the limiter uses. Prepended to every script, before _lib.lua. (A limiter built
-- with an injected clock, for tests, prepends a `now` read from its last argument instead.)
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
