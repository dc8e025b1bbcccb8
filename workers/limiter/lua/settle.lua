-- settle.lua: a granted call ended (settle) or never went out (release).
-- KEYS[1..6]  the scope's (see _lib.lua)
-- ARGV[1]     {limits (absent for a release: the last write's), sent: false for a release
--             (the request is refunded too), reserved: {input, output} tokens, used:
--             {input, output} tokens, lease, acquired_s: the second of the acquire, send_us:
--             the planned send, wait_s: the grant's wait, stats_window_s, headers (absent:
--             none; applied after the true-up exactly as sync.lua right after it would),
--             counts: {STAT_FIELDS name = count} to add at the settle second (the answer's
--             cache figures)}
-- Returns 1 if the lease was still held.
--
-- True-up per dimension: what was used beyond the reservation is debited now; what was
-- reserved and not used is credited in full, capped: the level never rises above capacity
-- (tat >= now) nor above empty at the end of a cooldown (tat >= cd + burst). The grant's
-- counters are written here: requests at its send second (unless released), tokens now,
-- waits at the second of the acquire.

local now = now_us()
local keys = scope_keys(1)
local b = load(keys, A.limits, now)
local reserved = {1, A.reserved.input, A.reserved.output}
local used = {A.sent and 1 or 0, A.used.input, A.used.output}
local held = redis.call('ZREM', keys.leases, A.lease)
for k = 1, 3 do
  local per = b.per[k]
  if per and used[k] > reserved[k] then
    b.tat[k] = b.tat[k] + (used[k] - reserved[k]) * per
  elseif per and used[k] < reserved[k] then
    local credit = math.min(reserved[k] * per, b.burst) - math.min(used[k] * per, b.burst)
    local floor = math.max(now, b.cd + b.burst)
    b.tat[k] = math.min(b.tat[k], math.max(floor, b.tat[k] - credit))
  end
end
count_use(b, A.send_us, used, now)
save(b, now)
if A.headers then
  learn(keys, A.limits, A.headers)
  b = load(keys, A.limits, now)
  learn_share(b, A.headers, now)
  lower(b, A.headers, now)
  save(b, now)
end

local window, sec = A.stats_window_s, math.floor(now / 1e6)
stat_add(keys, window, now, sec, 'input_tokens', used[2])
stat_add(keys, window, now, sec, 'output_tokens', used[3])
if A.sent then stat_add(keys, window, now, math.floor(A.send_us / 1e6), 'requests', 1) end
for field, n in pairs(A.counts) do stat_add(keys, window, now, sec, field, n) end
if A.wait_s > 0 then
  stat_add(keys, window, now, A.acquired_s, 'waits', 1)
  stat_add(keys, window, now, A.acquired_s, 'wait_ms', math.floor(A.wait_s * 1000 + 0.5))
end
return held
