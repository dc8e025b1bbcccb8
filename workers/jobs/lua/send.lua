-- send.lua: the last check before a sub-agent's LLM call goes out, and the mark that it did.
-- The call is sent only while the writer's token is the part's claim and the job is neither
-- cancelled nor past its deadline; then the mark (the send's number and its estimate) is
-- stored in the job's "sent" hash before the request leaves, so a resume after a worker's
-- death knows a call went out whose answer it never got. One script, so a bulk cancel
-- (JobStore.cancel_unstarted, which skips marked sub-agents) sees the mark or stops the send.
-- KEYS[1] the job's claims hash    KEYS[2] the job's meta hash    KEYS[3] the job's sent hash
-- ARGV[1] part    ARGV[2] the writer's token (0: unfenced)    ARGV[3] the mark (JSON)
-- ARGV[4] ttl (s)
-- Returns {1} when marked (send it), {-1} when the claim is someone else's, {0, reason} when
-- the job was cancelled, {0, "", "deadline"} when its deadline has passed (the caller cancels).
local token = tonumber(ARGV[2])
if token > 0 then
  local current = redis.call('HGET', KEYS[1], ARGV[1])
  if not current or tonumber(string.match(current, '^(%d+)')) ~= token then return {-1} end
end
local meta = redis.call('HMGET', KEYS[2], 'cancelled', 'deadline')
if meta[1] then return {0, meta[1]} end
if meta[2] then
  local t = redis.call('TIME')
  if tonumber(t[1]) + tonumber(t[2]) / 1e6 >= tonumber(meta[2]) then
    return {0, '', 'deadline'}
  end
end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
redis.call('EXPIRE', KEYS[3], tonumber(ARGV[4]))
return {1}
