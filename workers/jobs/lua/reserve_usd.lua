-- reserve_usd.lua: reserve a call's worst case in dollars against a cap (a job's
-- max_cost_usd, a tenant's month), or refuse it. Once a job's reservation is refused the job
-- is capped for good (field `capped`), so every later call of it is refused too: the job
-- stops at one point, not call by call as reservations come and go.
-- KEYS[1] the hash: `usd` nano-dollars reserved and spent, `capped` why it stopped
-- ARGV[1] the cap (nano-dollars)    ARGV[2] this call's worst case (nano-dollars)
-- ARGV[3] ttl (s)    ARGV[4] the reason kept as `capped` on a refusal ("": none kept)
-- Returns {1, total} reserved, or {0, total, reason}.
local capped = redis.call('HGET', KEYS[1], 'capped')
local total = tonumber(redis.call('HGET', KEYS[1], 'usd') or '0')
if capped then return {0, total, capped} end
local worst = tonumber(ARGV[2])
if total + worst > tonumber(ARGV[1]) then
  if ARGV[4] ~= '' then
    redis.call('HSET', KEYS[1], 'capped', ARGV[4])
    redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
  end
  return {0, total, ARGV[4]}
end
redis.call('HINCRBY', KEYS[1], 'usd', worst)
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
return {1, total + worst}
