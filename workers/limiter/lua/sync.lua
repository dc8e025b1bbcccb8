-- sync.lua: fold a response's anthropic-ratelimit-* headers into the scope. KEYS and
-- ARGV[1..5]: see _lib.lua.
-- ARGV[6..8] -remaining of requests, input, output tokens ('' = absent): a level only ever
--            goes down to it, never up
-- ARGV[9..11] raw -limit values to learn ('' = none; the caller sends only those of
--            dimensions it has no configured limit for)

learn(9)
local now = now_us()
local b = load(now)
lower(b, 6, now)
save(b, now)
return 1
