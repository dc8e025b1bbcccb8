-- release.lua: a running part was put back on the broker (a retry, or a hand-back at
-- shutdown) carrying its token; its claim says "sent" until a worker receives that message.
-- A claim that moved on meanwhile (the message was received already, or the sweep took the
-- part over) is left alone. The worker's list keeps the part when the claim moved on to
-- "held" by this same worker: with a thread pool the consumer can receive the retry's
-- message (a countdown held in memory) before the task's thread gets here, and dropping
-- the part from the list then would hide it from the sweep should this worker die.
-- KEYS[1] the job's claims hash    KEYS[2] the worker's claims hash
-- ARGV[1] part    ARGV[2] token    ARGV[3] worker id    ARGV[4] job id
-- Returns 1 when released, 0 when the claim had moved on.
local part, token, worker = ARGV[1], ARGV[2], ARGV[3]
local current = redis.call('HGET', KEYS[1], part)
if current == token .. '|running|' .. worker then
  redis.call('HDEL', KEYS[2], ARGV[4] .. '|' .. part)
  redis.call('HSET', KEYS[1], part, token .. '|sent|')
  return 1
end
if current ~= token .. '|held|' .. worker then
  redis.call('HDEL', KEYS[2], ARGV[4] .. '|' .. part)
end
return 0
