-- cooldown.lua: a 429 said "retry after R seconds".
-- Preamble: _bucket, _share
-- KEYS[1..6]  the scope's (see _lib.lua)
-- ARGV[1]     {limits, retry_after_s: R}
-- Returns the seconds the cooldown holds from now. (The 429 itself is counted by telemetry:
-- drover_llm_calls.)
--
-- cooldown until = max(current, now + R); every bucket of the scope is empty at that instant
-- (tat >= cooldown until + burst), so traffic resumes at the refill rate, not in a burst.
-- When learning our share of the key, a 429 also cuts it by a tenth (_share.lua): the
-- provider refused what we planned with, so our share was less.

local b = load(scope_keys(1), A.limits)
b.cd = math.max(b.cd, now + A.retry_after_s * 1e6)
for d in pairs(b.tat) do
  b.tat[d] = math.max(b.tat[d], b.cd + b.burst)
  if b.learning then set_share(b, d, b.sh[d].share * SHARE_CUT) end
end
save(b)
return num((b.cd - now) / 1e6)
