-- _true_up.lua: helpers of settle, cooldown and sync, prepended after _lib.lua (acquire
-- does without them: every function defined here is a closure made on every call).

-- The highest level a refund of dimension k may restore at time t: what the send-side
-- bucket allows.
local function ceiling(h, k, t)
  local q = h[SQ + k]
  if q ~= q then return CAP[k] end
  return min(CAP[k], h[SS + k] + RATE[k] * ((t - q) / 1e6))
end

-- True up dimension k by -delta for a request sent at s_x (us) that reserved `reserved`.
-- An extra debit (delta > 0) lowers both views of the bucket, and the peaks of the windows
-- wholly after s_x. A refund (delta < 0) lifts the send-side level by what that send
-- really saved, then the level, never above the ceiling.
-- What it saved: lifting every send-side level since s_x by the refund is exact until one
-- of them would pass capacity (refill there was really lost), so the credit is at most
-- capacity less the highest send-side level since s_x, which the peak ring bounds from
-- above (its windows from that of s_x to the latest, each lifted in turn by the credit).
-- Also sound, and better for a send older than the ring or alone in its window after an
-- idle spell (whose own level before it, capacity, is in its window): the level right
-- after s_x is at most capacity - reserved and rose by at most rate x (q - s_x) since.
local function adjust(h, k, delta, s_x, reserved)
  local rate = RATE[k]
  if not rate or delta == 0 then return end
  local cap = CAP[k]
  local o = RING[k]
  local n, q = h[o], h[SQ + k]
  local m = floor(s_x / W_US)
  if delta > 0 then
    h[k] = h[k] - delta
    if q == q then h[SS + k] = h[SS + k] - delta end
    if n == n then
      for j = max(m + 1, n - NW + 1), n do
        local i = o + 1 + j % NW
        h[i] = h[i] - delta
      end
    end
    return
  end
  if q == q then
    local saved = min(reserved, cap) - min(reserved + delta, cap)
    local credit, from = saved, nil
    if s_x < q then credit = max(0, saved - rate * ((q - s_x) / 1e6)) end
    if n == n and m > n - NW then
      from = min(m, n)
      local top = NEG
      for j = from, n do top = max(top, h[o + 1 + j % NW]) end
      credit = max(credit, min(saved, max(0, cap - top)))
    elseif n == n then
      from = n - NW + 1
    end
    if from then
      for j = from, n do
        local i = o + 1 + j % NW
        h[i] = h[i] + credit
      end
    end
    h[SS + k] = min(cap, h[SS + k] + credit)
  end
  h[k] = min(ceiling(h, k, h[T]), h[k] - delta)
end

-- Response headers (sync.lua, and settle.lua when given them), A[j0..j0+2] = -remaining of
-- requests / input / output, A[j0+3..j0+5] = raw -limit values to learn (NaN = none).
-- learn(): store the learned limits (before the bucket is loaded, so it uses them);
-- returns true if there were any.
local LEARNED_TTL_MS = 24 * 3600 * 1000
local function learn(j0)
  local learned = {}
  for k = 1, 3 do
    local v = A[j0 + 2 + k]
    if v then
      learned[#learned + 1] = ({'r', 'i', 'o'})[k]; learned[#learned + 1] = fmt(v)
    end
  end
  if #learned == 0 then return false end
  call('HSET', KEYS[3], unpack(learned))
  call('PEXPIRE', KEYS[3], LEARNED_TTL_MS)
  return true
end

-- lower(): a -remaining value can only lower a level, never raise it.
local function lower(h, j0)
  for k = 1, 3 do
    local rem = A[j0 - 1 + k]
    if RATE[k] and rem then h[k] = min(h[k], rem) end
  end
end
