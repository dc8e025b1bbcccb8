-- takeover.lua: the sweep takes a part away from a dead worker (or, expected -1, whatever
-- holds it: the broker lost its message) with a new token, which the re-sent message
-- carries; any older copy, should it ever run, is stale. A part that finished or moved on is
-- only dropped from the dead worker's list.
-- KEYS[1] the job's claims hash    KEYS[2] the dead worker's claims hash (or a dummy key)
-- KEYS[3] the job's records    KEYS[4] the fence hash (_epoch.lua)
-- ARGV[1] part    ARGV[2] the token expected (-1: any claim)
-- ARGV[3] the dead worker's id ("" with a token: the claim must still say "sent" with it;
-- ignored with token -1)    ARGV[4] job id    ARGV[5] ttl (s)
-- Returns the new token (> 0), or 0 when there is nothing to take over.
local part, expected, worker = ARGV[1], tonumber(ARGV[2]), ARGV[3]
redis.call('HDEL', KEYS[2], ARGV[4] .. '|' .. part)
if redis.call('HEXISTS', KEYS[3], part) == 1 then return 0 end
local current = redis.call('HGET', KEYS[1], part) or '0|sent|'
local token, state, holder = string.match(current, '^(%d+)|(%a*)|(.*)$')
token = tonumber(token)
if expected >= 0 and worker == '' then  -- a message nobody recorded receiving
  if token ~= expected or state ~= 'sent' then return 0 end
elseif expected >= 0 and (token ~= expected or holder ~= worker or state == 'sent') then
  return 0
end
local new = mint(token, tonumber(ARGV[5]))
redis.call('HSET', KEYS[1], part, new .. '|sent|')
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[5]))
return new
