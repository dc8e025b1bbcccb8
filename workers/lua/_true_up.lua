-- _true_up.lua: helpers of settle, cooldown and sync, prepended after _lib.lua (acquire
-- does without them: every function defined here is a closure made on every call).

-- The highest level a refund may restore at st.t: what the send-side bucket allows.
local function ceiling(st, d)
  if not d.q then return d.cap end
  return min(d.cap, d.S + d.rate * ((st.t - d.q) / 1e6))
end

-- True up dimension k by -delta for a request sent at s_x (us) that reserved `reserved`.
-- An extra debit (delta > 0) lowers both views of the bucket. A refund (delta < 0) lifts
-- the send-side level by what that send really saved (less what refill clamped at capacity
-- may have absorbed since: at most rate x (q - s_x)), then the level, never above the
-- ceiling.
local function adjust(st, k, delta, s_x, reserved)
  local d = st.dims[k]
  if not d or delta == 0 then return end
  if delta > 0 then
    d.level = d.level - delta
    if d.q then d.S = d.S - delta end
    return
  end
  if d.q then
    local saved = min(reserved, d.cap) - min(reserved + delta, d.cap)
    if s_x < d.q then saved = max(0, saved - d.rate * ((d.q - s_x) / 1e6)) end
    d.S = min(d.cap, d.S + saved)
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
