-- admitted.lua: the response headers of a paced send (hold_back.lua answered 'paced') came
-- back now. A stream's headers come at its admission, so the provider admitted it at `now`
-- at the latest, and its bucket (one request; or a prompt larger than its input bucket)
-- admits the next paced send one interval of its full rate later: that instant, plus a
-- margin, is the scope's `ad`, which hold_back.lua holds the next paced sends until. The
-- full rate is the limit before the target utilisation (`lu`: the limiter's limits are the
-- provider's x lu). Only a scope still paced is written (its bucket hash exists then); `ad`
-- only moves later, so headers that come out of order, late or never block nothing.
-- KEYS[i]  the bucket hash of scope i (those hold_back.lua was asked about; a pool's
--          organisation and key: one hash tag)
-- ARGV[1]  {inp: the send's input reservation}
-- Returns nothing.

local MARGIN_US = 10000  -- the provider's clock and ours, and rounding: 10 ms
for i = 1, #KEYS do
  local f, wait = hash(KEYS[i]), 0
  local lu = f.lu or 1
  if f.Lr and f.burst and f.Lr * f.burst < 60 then wait = 60e6 * lu / f.Lr end
  if f.Li and f.burst and (A.inp or 0) * 60e6 / f.Li > f.burst * 1e6 then
    wait = math.max(wait, A.inp * 60e6 * lu / f.Li)
  end
  if wait > 0 then
    redis.call('HSET', KEYS[i], 'ad', num(math.max(f.ad or 0, now + wait + MARGIN_US)))
  end
end
