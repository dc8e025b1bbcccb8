-- receive.lua: a worker took a message of a job's part off the broker (to run it, or to hold
-- it: prefetched, or waiting out a retry countdown). It becomes the part's holder, so the
-- sweep knows whom to ask about it, unless the message is stale (another carries the claim).
-- KEYS[1] the job's claims hash    KEYS[2] the worker's claims hash    KEYS[3] the job's records
-- ARGV[1] part ("0".. | "join" | "plan")    ARGV[2] the message's token    ARGV[3] worker id
-- ARGV[4] job id    ARGV[5] ttl of the hashes (s)
-- Returns 1 when the worker holds the part now, 0 when it is finished, -1 when stale.
local part, token, worker = ARGV[1], tonumber(ARGV[2]), ARGV[3]
if redis.call('HEXISTS', KEYS[3], part) == 1 then return 0 end
local current = redis.call('HGET', KEYS[1], part)
local held = current and tonumber(string.match(current, '^(%d+)')) or 0
if held ~= token then return -1 end
redis.call('HSET', KEYS[1], part, token .. '|held|' .. worker)
redis.call('HSET', KEYS[2], ARGV[4] .. '|' .. part, token)
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[5]))
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[5]))
return 1
