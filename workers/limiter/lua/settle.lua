-- settle.lua: a call ended (settle) or never went out (release). Prepended with _head.lua
-- and _lib.lua (KEYS[1..5] and A[1..6] = ARGV[1] are described in _head.lua; limits
-- -1 = stored).
-- A[7] input delta (actual - reserved)   A[8] output delta
-- A[9] request delta (0 for settle: the request stays counted; -1 for release)
-- A[10] actual input tokens   A[11] actual output tokens (for the stats)
-- A[12] stats_window_s   A[13] the second of the acquire
-- A[14] the grant's send time (us)   A[15], A[16] reserved input, output tokens
-- A[17] the grant's wait (s)
-- A[18..23] optional: the response's headers, as in sync.lua (-remaining r,i,o, then
--           -limit r,i,o to learn; NaN = absent), applied after the true-up exactly as a
--           sync right after this settle would (one round trip instead of two)
-- ARGV[2] lease id
-- Positive deltas are extra debits (the level may go negative, later acquirers wait);
-- negative ones refund, never above capacity. Returns 1 if the lease was still held.
-- The grant's counters are written here, not by acquire (which stays shorter on the path
-- before every call): 'requests' at its send second unless it is released (never sent),
-- 'waits' and 'wait_ms' at the second of the acquire.

local now = clock()
local h = load(now, call('GET', KEYS[1]))
local held = call('ZREM', KEYS[2], ARGV[2])
if held == 1 then h[NL] = h[NL] - 1 end  -- (absent stays absent: NaN - 1)
local s_x = A[14]
adjust(h, 1, A[9], s_x, 1)
adjust(h, 2, A[7], s_x, A[15])
adjust(h, 3, A[8], s_x, A[16])
if NA >= 23 then
  if learn(18) then h = load(now, pack(REC, unpack(h, 1, NREC))) end
  lower(h, 18)
end
save(h, now)
local window = A[12]
local sec = floor(now / 1e6)
stat_add(window, now, sec, 'input_tokens', A[10])
stat_add(window, now, sec, 'output_tokens', A[11])
if A[9] == 0 then
  stat_add(window, now, floor(s_x / 1e6), 'requests', 1)
end
local wait = A[17]
if wait > 0 then
  stat_add(window, now, A[13], 'waits', 1)
  stat_add(window, now, A[13], 'wait_ms', floor(wait * 1000 + 0.5))
end
return held
