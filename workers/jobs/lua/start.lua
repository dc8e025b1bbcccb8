-- start.lua: a delivery of a job's part starts running. It takes the claim with a new fencing
-- token when its message carries the current one; every later write of the part names that
-- token, so a delivery that started earlier (or a copy of this message) can no longer write.
-- KEYS[1] the job's claims hash    KEYS[2] the worker's claims hash    KEYS[3] the job's records
-- KEYS[4] the fence hash (_epoch.lua: the token's epoch survives a failover)
-- KEYS[5] the job's starts hash (part -> the delivery that took its running claim|token)
-- ARGV[1] part    ARGV[2] the message's token    ARGV[3] worker id    ARGV[4] job id
-- ARGV[5] ttl of the hashes (s)    ARGV[6] this start's delivery id (one per start, the same
-- when the client sends it again)
-- Returns the new token (> 0), 0 when the part is finished, -1 when the message is stale.
-- Sent again, a start that ran already (its reply lost to a restart or a read that timed out:
-- the client retries the command) gets the token it took then, not -1: its delivery would
-- stop as a late copy and leave the claim "running" on a live worker that runs nothing.
local part, token, worker = ARGV[1], tonumber(ARGV[2]), ARGV[3]
if redis.call('HEXISTS', KEYS[3], part) == 1 then return 0 end
local current = redis.call('HGET', KEYS[1], part)
local held = current and tonumber(string.match(current, '^(%d+)')) or 0
if held ~= token then
  if current == held .. '|running|' .. worker
      and redis.call('HGET', KEYS[5], part) == ARGV[6] .. '|' .. held then
    return held
  end
  return -1
end
local new = mint(token, tonumber(ARGV[5]))
redis.call('HSET', KEYS[1], part, new .. '|running|' .. worker)
redis.call('HSET', KEYS[2], ARGV[4] .. '|' .. part, new)
redis.call('HSET', KEYS[5], part, ARGV[6] .. '|' .. new)
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[5]))
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[5]))
redis.call('EXPIRE', KEYS[5], tonumber(ARGV[5]))
return new
