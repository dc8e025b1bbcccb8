-- sync.lua: fold a response's anthropic-ratelimit-* headers into the scope. Prepended
-- with _lib.lua.
-- KEYS[1] bucket  KEYS[2] leases  KEYS[3] learned  KEYS[4] stats  KEYS[5] statidx
-- ARGV[1..3] limits/min (requests, input, output)   ARGV[4] burst_s   ARGV[5] learned util
-- ARGV[6] now_us override, EMPTY IN PRODUCTION
-- ARGV[7..9]   -remaining of requests / input / output ('' = header absent)
-- ARGV[10..12] -limit of requests / input / output, sent only for dimensions that are not
--              configured ('' otherwise); stored raw in KEYS[3] (24 h), acquire uses it
--              times ARGV[5]
-- A -remaining value can only lower a level, never raise it: level = min(level, remaining).

local LEARNED_TTL_MS = 24 * 3600 * 1000
local learned = {}
for k = 1, 3 do
  local v = ARGV[9 + k]
  if v ~= '' then
    learned[#learned + 1] = DIM[k]; learned[#learned + 1] = v
  end
end
if #learned > 0 then
  redis.call('HSET', KEYS[3], unpack(learned))
  redis.call('PEXPIRE', KEYS[3], LEARNED_TTL_MS)
end
local now = clock()
local st = load(now)
for k = 1, 3 do
  local d = st.dims[k]
  local rem = tonumber(ARGV[6 + k])
  if d and rem then d.level = math.min(d.level, rem) end
end
save(st)
return 1
