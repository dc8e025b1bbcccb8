-- settle.lua: a call ended (settle) or never went out (release). Prepended with _lib.lua.
-- KEYS[1] bucket  KEYS[2] leases  KEYS[3] learned  KEYS[4] stats  KEYS[5] statidx
-- ARGV[1..3] limits/min (requests, input, output; '*' = stored)   ARGV[4] burst_s
-- ARGV[5] learned util   ARGV[6] now_us override, EMPTY IN PRODUCTION
-- ARGV[7] lease id   ARGV[8] input delta (actual - reserved)   ARGV[9] output delta
-- ARGV[10] request delta (0 for settle: the request stays counted; -1 for release)
-- ARGV[11] actual input tokens   ARGV[12] actual output tokens (for the stats)
-- ARGV[13] stats_window_s   ARGV[14] second whose 'requests' counter ARGV[10] corrects
-- ARGV[15] the grant's send time (us)   ARGV[16], ARGV[17] reserved input, output tokens
-- Positive deltas are extra debits (the level may go negative, later acquirers wait);
-- negative ones refund, never above capacity. Returns 1 if the lease was still held.

local now = clock()
local st = load(now)
local held = redis.call('ZREM', KEYS[2], ARGV[7])
local s_x = tonumber(ARGV[15])
adjust(st, 1, tonumber(ARGV[10]), s_x, 1)
adjust(st, 2, tonumber(ARGV[8]), s_x, tonumber(ARGV[16]))
adjust(st, 3, tonumber(ARGV[9]), s_x, tonumber(ARGV[17]))
save(st)
local window = tonumber(ARGV[13])
local sec = math.floor(now / 1e6)
stat_add(window, now, sec, 'input_tokens', tonumber(ARGV[11]))
stat_add(window, now, sec, 'output_tokens', tonumber(ARGV[12]))
if ARGV[14] ~= '' then
  stat_add(window, now, tonumber(ARGV[14]), 'requests', tonumber(ARGV[10]))
end
return held
