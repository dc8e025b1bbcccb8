-- sync.lua: fold a response's anthropic-ratelimit-* headers into the scope. KEYS and
-- ARGV[1..6]: see _lib.lua.
-- ARGV[7..9]   -remaining of requests, input, output tokens ('' = absent): a level only
--              ever goes down to it, never up
-- ARGV[10..12] -limit of requests, input, output tokens ('' = absent): learned where no
--              limit is configured, and the key's limit when learning our share

learn(10)
local now = now_us()
local b = load(now)
learn_share(b, 7, now)
lower(b, 7, now)
save(b, now)
return 1
