-- release.lua: a running part was put back on the broker (a retry, or a hand-back at
-- shutdown) carrying its token; its claim says "sent" until a worker receives that message.
-- A claim that moved on meanwhile (the message was received already, or the sweep took the
-- part over) is left alone.
-- KEYS[1] the job's claims hash    KEYS[2] the worker's claims hash
-- ARGV[1] part    ARGV[2] token    ARGV[3] worker id    ARGV[4] job id
-- Returns 1 when released, 0 when the claim had moved on.
local part, token = ARGV[1], ARGV[2]
redis.call('HDEL', KEYS[2], ARGV[4] .. '|' .. part)
if redis.call('HGET', KEYS[1], part) ~= token .. '|running|' .. ARGV[3] then return 0 end
redis.call('HSET', KEYS[1], part, token .. '|sent|')
return 1
