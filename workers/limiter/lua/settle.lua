-- settle.lua: a granted call ended (settle) or never went out (release).
-- Preamble: _bucket, _share, _stats
-- KEYS[1..6]  the scope's (see _lib.lua)
-- ARGV[1]     {limits (absent for a release: the last write's), sent: false for a release
--             (the request is refunded too), reserved: {input, output, max_tokens: the
--             acquire's (absent: none)} tokens, used:
--             {input, output} tokens, lease, acquired_s: the second of the acquire, send_us:
--             the planned send, wait_s: the grant's wait (wait_ms: the same in ms),
--             stats_window_s, headers (absent: none; applied after the true-up exactly as
--             sync.lua right after it would),
--             counts: {STAT_FIELDS name = count} to add at the settle second (the answer's
--             cache figures)}
-- Returns 1 if the lease was still held.
--
-- True-up per dimension: what was used beyond the reservation is debited now; what was
-- reserved and not used is credited in full, capped: the level never rises above capacity
-- (tat >= now) nor above empty at the end of a cooldown (tat >= cd + burst). The grant's
-- counters are written here: requests at its send second (unless released), tokens now,
-- waits at the second of the acquire.

local keys = scope_keys(1)
local b = load(keys, A.limits)
local reserved = costed(b, per_dim(1, A.reserved.input, A.reserved.output, A.reserved.max_tokens))
local used = costed(b, per_dim(A.sent and 1 or 0, A.used.input, A.used.output))
local held = redis.call('ZREM', keys.leases, A.lease)
for d, per in pairs(b.per) do
  if used[d] > reserved[d] then
    b.tat[d] = b.tat[d] + (used[d] - reserved[d]) * per
  elseif used[d] < reserved[d] then
    local credit = math.min(reserved[d] * per, b.burst) - math.min(used[d] * per, b.burst)
    b.tat[d] = math.min(b.tat[d], math.max(now, b.cd + b.burst, b.tat[d] - credit))
  end
end
-- The output bucket of the calls that went out (hold_back.lua: at the limit before any
-- share) takes the answer instead of the reservation its send debited, and at least as the
-- provider holds it now: an answer of `used` tokens just generated leaves its bucket at most
-- that much below full, whatever refill it could not bank while the call was out (trued up
-- alone, from a bucket that was full while the answer generated, the next send went 0.1 s
-- early: a 429). Calls that overlap count once each: no answer is debited twice.
-- The same of a weighted tokens quota (`st`, hold_back.lua): the answer's input + tw x
-- output in place of what its send took.
if A.sent and b.base.t and b.st > 0 then
  local per = 60e6 / b.base.t
  b.st = math.max(b.st + (used.t - reserved.t) * per, now + used.t * per)
end
if A.sent and b.base.o and b.so > 0 then
  local per = 60e6 / b.base.o
  b.so = math.max(b.so + (used.o - reserved.o) * per, now + used.o * per)
end
count_use(b, A.send_us, used)
save(b)
if A.headers then save(fold_headers(keys, A.limits, A.headers)) end

A.counts.input_tokens = (A.counts.input_tokens or 0) + used.i
A.counts.output_tokens = (A.counts.output_tokens or 0) + used.o
stat_add(keys, math.floor(now / 1e6), A.counts)
if A.sent then stat_add(keys, math.floor(A.send_us / 1e6), {requests = 1}) end
if A.wait_s > 0 then stat_add(keys, A.acquired_s, {waits = 1, wait_ms = A.wait_ms}) end
return held
