-- admitted.lua: the response headers of a paced send (hold_back.lua answered 'paced') came
-- back now. A stream's headers come at its admission, so the provider admitted it at `now`
-- at the latest. Its bucket of one request admits the next send one interval of its full
-- rate later (`ar`); its input bucket, which a prompt larger than it must find full, admits
-- the next such prompt once this send's input has refilled at that rate (`ai`: a smaller
-- prompt needs only its own room, which `si` keeps). Each instant, plus a margin, is where
-- hold_back.lua holds the next paced sends until. The full rate is the limit before the
-- target utilisation (`lu`: the limiter's limits are the provider's x lu). Only a scope
-- still paced is written (its bucket hash exists then); each field only moves later, so
-- headers that come out of order, late or never block nothing.
-- KEYS[i]  the bucket hash of scope i (those hold_back.lua was asked about; a pool's
--          organisation and key: one hash tag)
-- ARGV[1]  {inp: the send's input reservation}
-- Returns nothing.

local MARGIN_US = 10000  -- the provider's clock and ours, and rounding: 10 ms
for i = 1, #KEYS do
  local f, set = hash(KEYS[i]), {}
  local lu = f.lu or 1
  if paced_scope(f.Lr, f.burst) then
    put(set, 'ar', math.max(f.ar or 0, now + 60e6 * lu / f.Lr + MARGIN_US))
  end
  if f.Li and f.burst and (A.inp or 0) * 60e6 / f.Li > f.burst * 1e6 then
    put(set, 'ai', math.max(f.ai or 0, now + A.inp * 60e6 * lu / f.Li + MARGIN_US))
  end
  if #set > 0 then redis.call('HSET', KEYS[i], unpack(set)) end
end
