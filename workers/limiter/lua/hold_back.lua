-- hold_back.lua: right before a call that waited for its planned send goes out, is a
-- cooldown holding now on a scope its grant reserved in? A 429 that came while it waited
-- said the provider's bucket is empty, which the reservation, planned before, knew nothing
-- of (cooldown.lua holds back only the grants made after it). If so, the grant's lease goes
-- (the call will not go out on it) but its reservation stays debited: the provider's refill
-- during the cooldown is not ours to plan with (cooldown.lua empties the level at its end),
-- and a refund would let the call, planned again, take the place of a call granted before
-- the 429 for after the cooldown: two sends for one place (measured: 13 sends planned for
-- one instant after a cooldown, 7 of them 429s).
-- A pool's key disabled while the call waited (a 401/403 on another worker) holds it back
-- the same way, for good: the call moves to another key instead of being refused too.
-- KEYS[2i - 1], KEYS[2i]  the bucket hash and the leases of scope i (the one key's; a
--                         pool's organisation and key: one hash tag)
-- KEYS[last]              with ARGV's key (a pool's): the pool's disabled keys (hash alias
--                         -> until, us)
-- ARGV[1]                 {lease: the grant's lease id, key: the pool key's alias (a pool's)}
-- Returns the seconds (a string) the longest of those cooldowns still holds, a day for a
-- disabled key; '0': none, and the grant stands.

local until_us, scopes = now, A.key and #KEYS - 1 or #KEYS
for i = 1, scopes, 2 do
  until_us = math.max(until_us, tonumber(redis.call('HGET', KEYS[i], 'cd') or '0'))
end
if A.key and tonumber(redis.call('HGET', KEYS[#KEYS], A.key) or '0') > now then
  until_us = math.max(until_us, now + 86400 * 1e6)
end
if until_us > now then
  for i = 2, scopes, 2 do redis.call('ZREM', KEYS[i], A.lease) end
end
return num((until_us - now) / 1e6)
