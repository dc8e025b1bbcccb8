-- record.lua: store a sub-agent's record once, from the delivery that holds its claim (token 0:
-- the sweep's, unfenced), let go of the claim, and count the record in the same step: the
-- job's status counters, the record's entry on the job's event stream (its index and status
-- only: readers take the record from the records hash) and the sub-agent's final state.
-- KEYS[1] the job's claims hash    KEYS[2] the job's records    KEYS[3] the worker's claims hash
-- KEYS[4] the job's status counts    KEYS[5] the job's event stream
-- KEYS[6] the job's final states (hash: index -> the last checkpoint, its transcript and
-- report: the one full copy of its answer)    KEYS[7] the sub-agent's running checkpoint
-- KEYS[8] the sub-agent's tool results    KEYS[9] the job's send marks
-- KEYS[10] the job's starts (start.lua: which delivery took the claim)
-- ARGV[1] part (the index)    ARGV[2] the writer's token (0: unfenced)    ARGV[3] the record
-- (JSON)    ARGV[4] job id    ARGV[5] ttl (s)    ARGV[6] the record's status
-- ARGV[7] the final state (JSON; "" for none)
-- Returns the job's record count once this one is stored (>= 1: the fair-share refill needs
-- it), 0 when a record was there already, -1 when the claim is not ours.
-- Once the record is in, a delivery of this part stops at the record (start.lua, receive.lua,
-- JobStore.start), so what only a resume needs goes: the running checkpoint, the tool
-- results and the send mark.
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
if ARGV[7] ~= '' then
  redis.call('HSET', KEYS[6], part, ARGV[7])
  redis.call('EXPIRE', KEYS[6], ttl)
end
redis.call('DEL', KEYS[7], KEYS[8])
redis.call('HDEL', KEYS[9], part)
redis.call('HDEL', KEYS[10], part)
redis.call('XADD', KEYS[5], '*', 'i', part, 's', ARGV[6])
redis.call('EXPIRE', KEYS[5], ttl)
return redis.call('HLEN', KEYS[2])
