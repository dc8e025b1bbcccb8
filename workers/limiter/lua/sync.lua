-- sync.lua: fold a response's anthropic-ratelimit-* headers into the scope. Prepended
-- with _head.lua and _lib.lua (KEYS[1..5] and A[1..6] = ARGV[1]: see _head.lua).
-- A[7..9]   -remaining of requests / input / output (NaN = header absent)
-- A[10..12] -limit of requests / input / output, sent only for dimensions that are not
--           configured (NaN otherwise); stored raw in KEYS[3] (24 h), acquire uses it
--           times A[5]
-- A -remaining value can only lower a level, never raise it: level = min(level, remaining).

learn(7)
local now = clock()
local h = load(now, call('GET', KEYS[1]))
lower(h, 7)
save(h, now)
return 1
