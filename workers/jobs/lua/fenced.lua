-- fenced.lua: a write of a running part (its checkpoint, a tool result), made only while the
-- writer's token is still the part's claim: a superseded delivery writes nothing.
-- KEYS[1] the job's claims hash    KEYS[2] the key written
-- ARGV[1] part    ARGV[2] the writer's token    ARGV[3] "set" or "hset"    ARGV[4] ttl (s)
-- ARGV[5] value ("set") or field ("hset")    ARGV[6] value ("hset")
-- Returns 1 when written, 0 when the claim is someone else's.
local current = redis.call('HGET', KEYS[1], ARGV[1])
if not current or tonumber(string.match(current, '^(%d+)')) ~= tonumber(ARGV[2]) then
  return 0
end
if ARGV[3] == 'set' then
  redis.call('SET', KEYS[2], ARGV[5], 'EX', tonumber(ARGV[4]))
else
  redis.call('HSET', KEYS[2], ARGV[5], ARGV[6])
  redis.call('EXPIRE', KEYS[2], tonumber(ARGV[4]))
end
return 1
