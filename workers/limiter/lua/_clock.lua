-- _clock.lua: a fragment, included in clock() (_lib.lua) and in place in acquire.lua: the
-- includer's `now` is the test-only override A[6] (nil in production); else Redis' TIME.
if not now then
  local t = call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
