-- _true_up.lua: helpers of settle, cooldown and sync, prepended after _lib.lua (acquire
-- does without them: every function defined here is a closure made on every call).

-- The highest level a refund may restore at st.t: what the send-side bucket allows.
local function ceiling(st, d)
  if not d.q then return d.cap end
  return min(d.cap, d.S + d.rate * ((st.t - d.q) / 1e6))
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
local function adjust(st, k, delta, s_x, reserved)
  local d = st.dims[k]
  if not d or delta == 0 then return end
  local P, n = d.P, d.n
  local m = floor(s_x / W_US)
  if delta > 0 then
    d.level = d.level - delta
    if d.q then d.S = d.S - delta end
    if n then
      for j = max(m + 1, n - NW + 1), n do
        local i = j % NW + 1
        P[i] = P[i] - delta
      end
    end
    return
  end
  if d.q then
    local saved = min(reserved, d.cap) - min(reserved + delta, d.cap)
    local credit, from = saved, nil
    if s_x < d.q then credit = max(0, saved - d.rate * ((d.q - s_x) / 1e6)) end
    if n and m > n - NW then
      from = min(m, n)
      local top = NEG
      for j = from, n do top = max(top, P[j % NW + 1]) end
      credit = max(credit, min(saved, max(0, d.cap - top)))
    elseif n then
      from = n - NW + 1
    end
    if from then
      for j = from, n do
        local i = j % NW + 1
        P[i] = P[i] + credit
      end
    end
    d.S = min(d.cap, d.S + credit)
  end
  d.level = min(ceiling(st, d), d.level - delta)
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
local function lower(st, j0)
  for k = 1, 3 do
    local d = st.dims[k]
    local rem = A[j0 - 1 + k]
    if d and rem then d.level = min(d.level, rem) end
  end
end
