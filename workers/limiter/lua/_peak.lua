-- _peak.lua: a fragment, included in peak() (_lib.lua) and in place in acquire.lua. The
-- send-side level of dimension k reached v at time s (us): note it in the window of s (h,
-- k, s and v are the includer's). Windows skipped since the latest one get -inf: the level
-- only rose through them (refill) up to v, which the window of s holds, and every query
-- that spans them spans that one too. A time before the latest window counts in the latest
-- (a higher bound is safe).
do
  local o = RING[k]
  local n = h[o]
  local m = floor(s / W_US)
  if n ~= n or m >= n + NW then
    for i = o + 1, o + NW do h[i] = NEG end
    h[o] = m
  elseif m > n then
    for j = n + 1, m do h[o + 1 + j % NW] = NEG end
    h[o] = m
  else
    m = n
  end
  local i = o + 1 + m % NW
  h[i] = max(h[i], v)
end
