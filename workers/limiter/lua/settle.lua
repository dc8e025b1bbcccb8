-- settle.lua: a granted call ended (settle) or never went out (release). KEYS and
-- ARGV[1..6]: see _lib.lua.
-- ARGV[7] 1 = sent (settle), 0 = never sent (release: the request is refunded too)
-- ARGV[8], ARGV[9] input, output tokens reserved   ARGV[10], ARGV[11] input, output used
-- ARGV[12] stats window_s   ARGV[13] second of the acquire   ARGV[14] send time (us)
-- ARGV[15] the grant's wait (s)   ARGV[16] lease id
-- ARGV[17..22] the response's headers or '': -remaining r, i, o, then -limit r, i, o;
--   applied after the true-up exactly as sync.lua right after it would be
-- ARGV[23] n, then ARGV[24..23+2n] n pairs of a STAT_FIELDS name and a count to add at the
--   settle second (the answer's cache figures)
-- Returns 1 if the lease was still held.
--
-- True-up per dimension: what was used beyond the reservation is debited now; what was
-- reserved and not used is credited in full, capped: the level never rises above capacity
-- (tat >= now) nor above empty at the end of a cooldown (tat >= cd + burst). The grant's
-- counters are written here: requests at its send second (unless released), tokens now,
-- waits at the second of the acquire.

local now = now_us()
local b = load(now)
local sent = ARGV[7] == '1'
local reserved = {1, tonumber(ARGV[8]), tonumber(ARGV[9])}
local used = {sent and 1 or 0, tonumber(ARGV[10]), tonumber(ARGV[11])}
local held = redis.call('ZREM', KEYS[2], ARGV[16])
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
-- What the provider admitted of ours, for learn_share's windows: counted in the window the
-- call was sent in (a call that used no tokens was refused; one sent before the first
-- window began is in its -remaining already), and the mean call time, which sets how long
-- a window lasts.
if ARGV[6] == '1' and used[2] + used[3] > 0 then
  local sent_at = tonumber(ARGV[14])
  local took = math.max(0, now - sent_at)
  b.lat = b.lat and b.lat + 0.1 * (took - b.lat) or took
  for k = 1, 3 do
    if b.per[k] and b.t1[k] and sent_at >= b.t1[k] then
      b.u1[k] = b.u1[k] + used[k]
    elseif b.per[k] and b.t0[k] and sent_at >= b.t0[k] then
      b.u0[k] = b.u0[k] + used[k]
    end
  end
end
save(b, now)
if ARGV[17] ~= '' or ARGV[18] ~= '' or ARGV[19] ~= '' or ARGV[20] ~= '' or ARGV[21] ~= ''
    or ARGV[22] ~= '' then
  learn(20)
  b = load(now)
  learn_share(b, 17, now)
  lower(b, 17, now)
  save(b, now)
end

local window, sec = tonumber(ARGV[12]), math.floor(now / 1e6)
stat_add(window, now, sec, 'input_tokens', used[2])
stat_add(window, now, sec, 'output_tokens', used[3])
if sent then stat_add(window, now, math.floor(tonumber(ARGV[14]) / 1e6), 'requests', 1) end
for j = 1, tonumber(ARGV[23]) do
  stat_add(window, now, sec, ARGV[22 + 2 * j], tonumber(ARGV[23 + 2 * j]))
end
local wait = tonumber(ARGV[15])
if wait > 0 then
  stat_add(window, now, tonumber(ARGV[13]), 'waits', 1)
  stat_add(window, now, tonumber(ARGV[13]), 'wait_ms', math.floor(wait * 1000 + 0.5))
end
return held
