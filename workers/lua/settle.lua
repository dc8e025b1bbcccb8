-- settle.lua: a call ended (settle) or never went out (release). Prepended with _lib.lua
-- (KEYS[1..5] and A[1..6] = ARGV[1] are described there; limits -1 = stored).
-- A[7] input delta (actual - reserved)   A[8] output delta
-- A[9] request delta (0 for settle: the request stays counted; -1 for release)
-- A[10] actual input tokens   A[11] actual output tokens (for the stats)
-- A[12] stats_window_s   A[13] second whose 'requests' counter A[9] corrects (NaN = none)
-- A[14] the grant's send time (us)   A[15], A[16] reserved input, output tokens
-- A[17..22] optional: the response's headers, as in sync.lua (-remaining r,i,o, then
--           -limit r,i,o to learn; NaN = absent), applied after the true-up exactly as a
--           sync right after this settle would (one round trip instead of two)
-- ARGV[2] lease id
-- Positive deltas are extra debits (the level may go negative, later acquirers wait);
-- negative ones refund, never above capacity. Returns 1 if the lease was still held.

local now = clock()
local st = load(now, call('GET', KEYS[1]))
local held = call('ZREM', KEYS[2], ARGV[2])
local s_x = A[14]
adjust(st, 1, A[9], s_x, 1)
adjust(st, 2, A[7], s_x, A[15])
adjust(st, 3, A[8], s_x, A[16])
if NA >= 22 then
  if learn(17) then st = load(now, (encode(st))) end
  lower(st, 17)
end
save(st)
local window = A[12]
local sec = floor(now / 1e6)
stat_add(window, now, sec, 'input_tokens', A[10])
stat_add(window, now, sec, 'output_tokens', A[11])
local req_sec = A[13]
if req_sec then
  stat_add(window, now, req_sec, 'requests', A[9])
end
return held
