-- finish.lua: store a part's record once, from the delivery that holds its claim (token 0:
-- from the sweep, which gives up on a part, unfenced), and let go of the claim.
-- KEYS[1] the job's claims hash    KEYS[2] the job's records    KEYS[3] the worker's claims hash
-- ARGV[1] part    ARGV[2] the writer's token (0: unfenced)    ARGV[3] the record (JSON)
-- ARGV[4] job id    ARGV[5] ttl (s)
-- Returns 1 when stored, 0 when a record was there already, -1 when the claim is not ours.
local part, token = ARGV[1], tonumber(ARGV[2])
if redis.call('HEXISTS', KEYS[2], part) == 1 then return 0 end
if token > 0 then
  local current = redis.call('HGET', KEYS[1], part)
  if not current or tonumber(string.match(current, '^(%d+)')) ~= token then return -1 end
end
redis.call('HSET', KEYS[2], part, ARGV[3])
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[5]))
redis.call('HDEL', KEYS[1], part)
redis.call('HDEL', KEYS[3], ARGV[4] .. '|' .. part)
return 1
