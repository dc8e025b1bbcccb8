-- _epoch.lua: prepended to the scripts that mint a fencing token (start.lua, takeover.lua).
-- A token is EPOCH * 1000000 + n. The epoch counts the masters the fence hash has seen: the
-- script compares this server's replication id (INFO replication's master_replid, which a
-- replica replaces with a new one when it is promoted) with the one stored there and, when
-- they differ, moves the epoch on. A promoted replica so mints tokens of a new epoch, which
-- no delivery can hold from the old master, even where that master's last tokens were never
-- replicated. Why this and not WAIT: workers/jobs/claims.py.
-- Uses the caller's KEYS[4] (the fence hash: replid, epoch); it lives as long as the claims
-- (ttl, s), so no claim outlives the epoch it was minted in.
local function mint(held, ttl)
  local info = redis.pcall('INFO', 'replication')
  local replid = type(info) == 'string' and string.match(info, 'master_replid:(%w+)') or ''
  local stored = redis.call('HMGET', KEYS[4], 'replid', 'epoch')
  local epoch = tonumber(stored[2]) or 0
  if stored[1] ~= replid or epoch == 0 then
    epoch = epoch + 1
    redis.call('HSET', KEYS[4], 'replid', replid, 'epoch', epoch)
  end
  redis.call('EXPIRE', KEYS[4], ttl)
  local base = epoch * 1000000
  if held >= base then return held + 1 end
  return base + held % 1000000 + 1
end
