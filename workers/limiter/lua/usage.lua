-- usage.lua: the per-second counters of the last N seconds, oldest first. Stand-alone.
-- KEYS[1] stats hash of the scope
-- ARGV[1] seconds N   ARGV[2] now_us override, EMPTY IN PRODUCTION
-- ARGV[3..] counter field names
-- Returns {first_second, values...} with len(fields) values per second ('' = 0).

local now
if ARGV[2] ~= '' then now = tonumber(ARGV[2]) else
  local t = redis.call('TIME'); now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local last = math.floor(now / 1e6)
local first = last - tonumber(ARGV[1]) + 1
local fields = {}
for sec = first, last do
  local s = string.format('%d', sec)
  for j = 3, #ARGV do fields[#fields + 1] = s .. ':' .. ARGV[j] end
end
local out = {string.format('%d', first)}
-- In slices: unpack() of more than ~8000 values fails ("too many results to unpack"), and a
-- window of an hour has 3600 x 7 fields.
local SLICE = 4000
for i = 1, #fields, SLICE do
  local vals = redis.call('HMGET', KEYS[1], unpack(fields, i, math.min(i + SLICE - 1, #fields)))
  for j = 1, #vals do out[#out + 1] = vals[j] or '' end
end
return out
