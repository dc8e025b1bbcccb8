-- cooling.lua: is a cooldown holding now, on any of the scopes a grant reserved in? Asked
-- right before a call that waited for its planned send goes out: a 429 that came while it
-- waited emptied the provider's bucket, and the reservation, planned before, knew nothing of
-- it (cooldown.lua holds back later grants only).
-- KEYS[1..n] the bucket hash of each scope (the one key's; a pool's organisation and key)
-- ARGV       none (but an injected test clock's time, last)
-- Returns the seconds (a string) the longest of those cooldowns still holds; '0' = none.

local now = now_us()
local until_us = now
for i = 1, #KEYS do
  until_us = math.max(until_us, tonumber(redis.call('HGET', KEYS[i], 'cd') or '0'))
end
return num((until_us - now) / 1e6)
