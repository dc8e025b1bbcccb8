-- _load.lua: a fragment, included (`--#include _load`) where a script loads the bucket:
-- load() in _lib.lua, and in place in acquire.lua (which defines no function). Expects
-- `now` and `raw` (the GET of KEYS[1], false when absent) and a declared `local h`; sets h
-- to the record as a flat array of NREC numbers (NaN = absent), brought to `now`:
-- continuous refill, capped at capacity; fills RATE and CAP. A dimension that is not
-- limited loses its state (it is written back absent).
do
  if raw and #raw == 8 * NREC then
    h = {unpack_d(REC, raw)}
  else
    local nd = raw and #raw / 8 or 0
    h = nd > 0 and {unpack_d('<' .. string.rep('d', nd), raw)} or {}
    for j = nd + 1, NREC do h[j] = NAN end
  end
  h[NREC + 1] = nil  -- unpack's next position
  local learned = nil
  if A[1] == nil or A[2] == nil or A[3] == nil then
    learned = call('HMGET', KEYS[3], 'r', 'i', 'o')
  end
  local burst = A[4]
  if burst == STORED then
    burst = h[BURST]
    if burst ~= burst then burst = 1 end
  end
  h[BURST] = burst
  local t = h[T]
  if t ~= t then t = now end
  h[T] = max(t, now)
  if h[CD] ~= h[CD] then h[CD] = 0 end
  for k = 1, 3 do
    local lim = A[k]
    if lim == STORED then
      lim = h[LIM + k]
      if lim ~= lim then lim = nil end
    elseif lim == nil and learned and learned[k] then
      lim = tonumber(learned[k]) * A[5]
    end
    if lim and lim > 0 then
      local rate = lim / 60
      local cap = rate * burst
      local level = h[k]
      if level ~= level then
        level = cap
      elseif now > t then
        level = min(cap, level + rate * ((now - t) / 1e6))
      else
        level = min(cap, level)
      end
      h[k] = level; h[LIM + k] = lim
      RATE[k] = rate; CAP[k] = cap
    else
      RATE[k] = nil; CAP[k] = nil
      h[k] = NAN; h[LIM + k] = NAN; h[SS + k] = NAN; h[SQ + k] = NAN
      local o = RING[k]
      for j = o, o + NW do h[j] = NAN end
    end
  end
end
