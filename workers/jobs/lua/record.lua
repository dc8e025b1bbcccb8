-- record.lua: store a sub-agent's record once, from the delivery that holds its claim (token 0:
-- the sweep's, unfenced), let go of the claim, and count the record in the same step: the
-- job's status counters, the sub-agent's report and the record on the job's event stream.
-- KEYS[1] the job's claims hash    KEYS[2] the job's records    KEYS[3] the worker's claims hash
-- KEYS[4] the job's status counts    KEYS[5] the job's event stream    KEYS[6] the report's key
-- KEYS[7] the sub-agent's checkpoint (its transcript)
-- ARGV[1] part (the index)    ARGV[2] the writer's token (0: unfenced)    ARGV[3] the record
-- (JSON)    ARGV[4] job id    ARGV[5] ttl (s)    ARGV[6] the record's status
-- ARGV[7] the report (JSON; "" for none)    ARGV[8] the final checkpoint (JSON; "" for none)
-- Returns the job's record count once this one is stored (>= 1: the fair-share refill needs
-- it), 0 when a record was there already, -1 when the claim is not ours.
local part, token, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[5])
if redis.call('HEXISTS', KEYS[2], part) == 1 then return 0 end
if token > 0 then
  local current = redis.call('HGET', KEYS[1], part)
  if not current or tonumber(string.match(current, '^(%d+)')) ~= token then return -1 end
end
redis.call('HSET', KEYS[2], part, ARGV[3])
redis.call('EXPIRE', KEYS[2], ttl)
redis.call('HDEL', KEYS[1], part)
redis.call('HDEL', KEYS[3], ARGV[4] .. '|' .. part)
-- Counts per status, so progress is one read however many records there are.
redis.call('HINCRBY', KEYS[4], ARGV[6], 1)
redis.call('EXPIRE', KEYS[4], ttl)
if ARGV[7] ~= '' then redis.call('SET', KEYS[6], ARGV[7], 'EX', ttl) end
if ARGV[8] ~= '' then redis.call('SET', KEYS[7], ARGV[8], 'EX', ttl) end
redis.call('XADD', KEYS[5], '*', 'record', ARGV[3])
redis.call('EXPIRE', KEYS[5], ttl)
return redis.call('HLEN', KEYS[2])
