-- sync.lua: fold a response's anthropic-ratelimit-* headers into the scope.
-- KEYS[1..6]  the scope's (see _lib.lua)
-- ARGV[1]     {limits, headers}: -remaining lowers a level, never raises it; -limit is
--             learned where no limit is configured, and is the key's limit when learning
--             our share of it (_share.lua)

local keys = scope_keys(1)
learn(keys, A.limits, A.headers)
local now = now_us()
local b = load(keys, A.limits, now)
learn_share(b, A.headers, now)
lower(b, A.headers, now)
save(b, now)
return 1
