-- _share.lua: learning which share of each limit is ours when other software uses the key
-- too (limits.learn_share); prepended after _bucket.lua to the scripts that name it. Its
-- state is the scope's share hash (_bucket.lua: load_share, save_share), b.sh once loaded:
-- per dimension d (r, i, o) b.sh[d]
--   share           the share of the key's limit that is ours (absent = 1), which
--                   multiplies the bucket's limit (_bucket.lua: load)
--   r0, t0, u0, x0  the previous window: the -remaining r0 at its start t0 (us), what our
--                   calls sent in it used (u0) and the highest -remaining in it (x0)
--   r1, t1, u1, x1  the current window, the same
--   top             the highest -remaining seen (a full bucket)
-- and b.sh.lt, the mean time (us) from a call's send to its settle.
--
-- The provider's bucket refills at the rate left for us and loses what it admits of ours,
-- so over a window from the -remaining r0 at t0 to r1 at t1
--     left = (r1 - r0 + what our calls sent in [t0, t1) used) / (the key's limit x (t1 - t0))
-- whether callers queue or not, and at an empty bucket too (all that refilled was then used
-- by us: a 429 refused the rest). A call counts in the window it was sent in (the provider
-- takes its input then), which settle learns only when the call ends: so a window is judged
-- SHARE_LATE mean call times after its end, its late calls in by then (a window lasts 2 s,
-- the headers being rounded, and at least SHARE_CALLS mean call times). (Counted in the
-- window of their settle instead, the calls in flight at a window's two ends made the
-- estimate a few percent noisy, and a share capped at 1 could only dip.) The share moves
-- halfway to `left`, down only by more than the estimate's noise (SHARE_NOISE: the calls
-- sent right at a window's ends, the rounding), so a key that is all ours keeps its whole
-- share. A window in which the bucket came near full (it may have wasted refill) gives only
-- a floor: the share climbs by 1/60 per second of it (all the way within a minute once the
-- others stop) or to `left` if higher. At its end, a window on the calls in so far (too
-- few, never too many) is a floor too: it lifts a share that fell too far without waiting.
-- A 429 cuts the share by a tenth at once (cooldown.lua).

local SHARE_MIN, SHARE_WINDOW_US, SHARE_CALLS, SHARE_LATE = 0.05, 2e6, 5, 4
local SHARE_GAIN, SHARE_NOISE, SHARE_CUT = 0.5, 0.03, 0.9

-- Our share of d's limit, within [SHARE_MIN, 1], and the bucket's limit with it.
local function set_share(b, d, share)
  b.sh[d].share, b.sh.changed = math.min(1, math.max(SHARE_MIN, share)), true
  set_limit(b, d, b.base[d] * b.sh[d].share)
end

local function judge_window(w, limit)
  local left = (w.r1 - w.r0 + w.u0) / (w.t1 - w.t0) / (limit / 60e6)
  if w.x0 >= 0.9 * w.top then return math.max(w.share + (w.t1 - w.t0) / 60e6, left) end
  if not (left > w.share or left < w.share - SHARE_NOISE) then return w.share end
  return w.share + SHARE_GAIN * (left - w.share)
end

-- A response's headers: its -remaining against the key's -limit, per dimension.
local function learn_share(b, headers)
  if not b.learning then return end
  local lat = b.sh.lt or 0
  for _, d in ipairs(DIMS) do
    local w, rem, limit = b.sh[d], headers.remaining[d], headers.limit[d]
    if b.per[d] and rem and limit and limit > 0 then
      b.sh.changed = true
      -- full: the most seen, and at least our own burst's worth of the key's limit
      w.top = math.max(w.top or limit / 60 * b.burst_s, rem)
      if not w.t1 or now < w.t1 then  -- a first header
        w.r0, w.t0, w.u0, w.x0 = nil, nil, nil, nil
        w.r1, w.t1, w.u1, w.x1 = rem, now, 0, rem
      else
        local share = w.share
        w.x1 = math.max(w.x1, rem)
        if w.t0 and now - w.t1 >= SHARE_LATE * lat then
          share = judge_window(w, limit)
          w.r0, w.t0, w.u0, w.x0 = nil, nil, nil, nil
        end
        if now - w.t1 >= math.max(SHARE_WINDOW_US, SHARE_CALLS * lat) then
          share = math.max(share, (rem - w.r1 + w.u1) / (now - w.t1) / (limit / 60e6))
          w.r0, w.t0, w.u0, w.x0 = w.r1, w.t1, w.u1, w.x1
          w.r1, w.t1, w.u1, w.x1 = rem, now, 0, rem
        end
        set_share(b, d, share)
      end
    end
  end
end

-- A settled call: what the provider admitted of it (`used`, by dimension) counts in the
-- window it was sent in (a call that used no tokens was refused; one sent before the first
-- window began is in its -remaining already), and its time from send to settle in the
-- mean, which sets how long a window lasts.
local function count_use(b, sent_at, used)
  if not b.learning or used.i + used.o == 0 then return end
  local s, took = b.sh, math.max(0, now - sent_at)
  s.lt = s.lt and s.lt + 0.1 * (took - s.lt) or took
  s.changed = true
  for d in pairs(b.per) do
    local w = s[d]
    if w.t1 and sent_at >= w.t1 then w.u1 = w.u1 + used[d]
    elseif w.t0 and sent_at >= w.t0 then w.u0 = w.u0 + used[d] end
  end
end

-- A response's headers: the -limit ones are kept for 24 h for the dimensions `limits` gives
-- no limit for (a configured limit always wins); then the bucket is loaded, and after the
-- share learns from them the -remaining ones only ever lower a level. Returns the bucket,
-- not yet saved.
local function fold_headers(keys, limits, headers)
  for _, d in ipairs(DIMS) do
    if limits.per_min[d] == nil and headers.limit[d] then
      redis.call('HSET', keys.learned, d, num(headers.limit[d]))
      redis.call('PEXPIRE', keys.learned, 24 * 3600 * 1000)
    end
  end
  local b = load(keys, limits)
  learn_share(b, headers)
  for d, per in pairs(b.per) do
    local left = headers.remaining[d]
    if left then b.tat[d] = math.max(b.tat[d], now + b.burst - left * per) end
  end
  return b
end
