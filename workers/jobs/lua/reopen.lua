-- reopen.lua: a finished job is opened again to re-run its sub-agents that did not end ok
-- (`drover retry`): their records go (their usage moves to the job's own usage, so every
-- call stays counted once), with their status counts, final states, claims and send marks;
-- the job's result, its cancel and its job-wide failure go; it is running again, with a new
-- deadline if it has one. All in one step, so a reader sees the job finished or reopened.
-- KEYS[1] the job's meta    KEYS[2] its records    KEYS[3] its status counts
-- KEYS[4] its final states    KEYS[5] its claims    KEYS[6] its send marks
-- KEYS[7] its result    KEYS[8] its own usage (hash of counters)
-- ARGV[1] the job's deadline_s ("" for none)    ARGV[2] ttl (s)
-- Returns {code, index...}: code 1 reopened (the indexes re-run; none: all were ok, and the
-- job is left as it was), -1 no such job, -2 still running (its status follows), -3 it has
-- no sub-agents (its planning failed).
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {-1} end
if status == 'queued' or status == 'planning' or status == 'running' then
  return {-2, status}
end
if tonumber(redis.call('HGET', KEYS[1], 'n') or '0') == 0 then return {-3} end
local raw = redis.call('HGETALL', KEYS[2])
local rerun = {}
for i = 1, #raw, 2 do
  local record = cjson.decode(raw[i + 1])
  local st = record['status'] or 'ok'
  if st ~= 'ok' then
    table.insert(rerun, raw[i])
    redis.call('HDEL', KEYS[2], raw[i])
    redis.call('HINCRBY', KEYS[3], st, -1)
    redis.call('HDEL', KEYS[4], raw[i])
    redis.call('HDEL', KEYS[5], raw[i])
    redis.call('HDEL', KEYS[6], raw[i])
    for name, value in pairs(record['usage'] or {}) do
      if type(value) == 'number' and value ~= 0 then
        if math.floor(value) == value and name ~= 'cost_usd' then
          redis.call('HINCRBY', KEYS[8], name, value)
        else
          redis.call('HINCRBYFLOAT', KEYS[8], name, tostring(value))
        end
      end
    end
  end
end
if #rerun == 0 then return {1} end
redis.call('EXPIRE', KEYS[8], tonumber(ARGV[2]))
redis.call('DEL', KEYS[7])
redis.call('HDEL', KEYS[1], 'cancelled', 'failed_all', 'finished', 'deadline')
redis.call('HSET', KEYS[1], 'status', 'running')
redis.call('HINCRBY', KEYS[1], 'retries', 1)
if ARGV[1] ~= '' then
  local now = redis.call('TIME')
  local at = tonumber(now[1]) + tonumber(now[2]) / 1e6 + tonumber(ARGV[1])
  redis.call('HSET', KEYS[1], 'deadline', string.format('%.6f', at))
end
local out = {1}
for _, index in ipairs(rerun) do table.insert(out, index) end
return out
