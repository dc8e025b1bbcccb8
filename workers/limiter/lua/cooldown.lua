-- cooldown.lua: a 429 said "retry after R seconds".
-- Preamble: _bucket, _share
-- KEYS[1..6]  the scope's (see _lib.lua)
-- ARGV[1]     {limits, retry_after_s: R, learnable: the dimensions (letters) whose share
--             the headers can teach back (absent: all)}
-- Returns the seconds the cooldown holds from now. (The 429 itself is counted by telemetry:
-- drover_llm_calls.)
--
-- cooldown until = max(current, now + R); every bucket of the scope is empty at that instant
-- (tat >= cooldown until + burst), so traffic resumes at the refill rate, not in a burst.
-- When learning our share of the key, a 429 also cuts it by a tenth (_share.lua): the
-- provider refused what we planned with, so our share was less. Only in the dimensions
-- whose -remaining headers can teach the share back: at a small key they are rounded too
-- coarsely to be read (providers.coarse_readings_dropped), so a cut there was never undone
-- and each 429 slowed the rest of the job by a tenth (bench.small_keys --mix: the share at
-- 0.66 after four 429s, the blocks after them at 1.3-1.6 x their bound).

local b = load(scope_keys(1), A.limits)
local learnable = {}
for _, d in ipairs(A.learnable or DIMS) do learnable[d] = true end
b.cd = math.max(b.cd, now + A.retry_after_s * 1e6)
for d in pairs(b.tat) do
  b.tat[d] = math.max(b.tat[d], b.cd + b.burst)
  if b.learning and learnable[d] then set_share(b, d, b.sh[d].share * SHARE_CUT) end
end
save(b)
return num((b.cd - now) / 1e6)
