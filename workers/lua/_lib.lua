-- _lib.lua: helpers of settle, cooldown, sync, state and record, prepended after _head.lua
-- (which describes the keys, the bucket record and the arguments). acquire.lua does the
-- same steps as clock(), load(), peak() and save() written out in place (see there).

local function ring(k)
  return 19 + (k - 1) * (1 + NW)
end

local function fmt(x)
  return format('%.17g', x)
end

local function clock()
  local now = A[6]
  if now then return now end
  local t = call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- The bucket record `raw` (false when absent) as a flat array h of NREC numbers (NaN =
-- absent), brought to `now`: continuous refill, capped at capacity; RATE and CAP filled.
-- A dimension that is not limited loses its state (it is written back absent).
local function load(now, raw)
  local h
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
      local o = ring(k)
      for j = o, o + NW do h[j] = NAN end
    end
  end
  return h
end

-- The send-side level of dimension k reached v at time s (us): note it in the window of s.
-- Windows skipped since the latest one get -inf: the level only rose through them (refill)
-- up to v, which the window of s holds, and every query that spans them spans that one too.
-- A time before the latest window counts in the latest (a higher bound is safe).
local function peak(h, k, s, v)
  local o = ring(k)
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

-- Write the bucket back. Its TTL is only ever extended, with slack, so PEXPIRE runs about
-- once a minute rather than on every call (a longer life is harmless: the state stays
-- exact, an expired bucket would merely have been full).
local function save(h, now)
  -- How long the bucket must live: long enough that an expired bucket would be full
  -- anyway, and as long as the lease set (whose expiry it keeps).
  local need = max(h[T], h[CD])
  if h[LX] == h[LX] then need = max(need, h[LX]) end
  for k = 1, 3 do
    local rate = RATE[k]
    if rate then
      local cap = CAP[k]
      need = max(need, h[T] + (cap - h[k]) / rate * 1e6)
      local q = h[SQ + k]
      if q == q then need = max(need, q + (cap - h[SS + k]) / rate * 1e6) end
    end
  end
  need = need + MARGIN_S * 1e6
  local extend = not (h[X] >= need)  -- also when absent (NaN)
  if extend then h[X] = need + TTL_SLACK_US end
  call('SET', KEYS[1], pack(REC, unpack(h, 1, NREC)), 'KEEPTTL')
  if extend then
    call('PEXPIRE', KEYS[1], format('%d', ceil((h[X] - now) / 1000)))
  end
end

-- Add n to a per-second counter; prune seconds older than the stats window. The index is
-- touched only when the counter is new (HINCRBY returned n): once per second and field.
local function stat_add(window_s, now, sec, field, n)
  if n == 0 then return end
  local s = format('%d', sec)
  if call('HINCRBY', KEYS[4], s .. ':' .. field, n) ~= n then return end
  if call('ZADD', KEYS[5], sec, s) == 1 then
    local cutoff = floor(now / 1e6) - window_s
    local old = call('ZRANGEBYSCORE', KEYS[5], '-inf', cutoff)
    if #old > 0 then
      local f = {}
      for _, o in ipairs(old) do
        for _, name in ipairs({'requests', 'input_tokens', 'output_tokens', 'waits', 'wait_ms',
                               'n429', 'n529', 'n5xx', 'nconn'}) do
          f[#f + 1] = o .. ':' .. name
        end
      end
      call('HDEL', KEYS[4], unpack(f))
      call('ZREMRANGEBYSCORE', KEYS[5], '-inf', cutoff)
    end
    local ms = (window_s + 60) * 1000
    call('PEXPIRE', KEYS[4], ms)
    call('PEXPIRE', KEYS[5], ms)
  end
end

