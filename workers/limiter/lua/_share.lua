-- _share.lua: learning which share of each limit is ours when other software uses the key
-- too (limits.learn_share); prepended after _lib.lua to every script. Its state is the
-- scope's share hash (_lib.lua: load_share, save_share), b.sh once loaded: per dimension
-- b.sh[k] (k = 1, 2, 3: requests, input, output tokens)
--   share           the share of the key's limit that is ours (absent = 1), which
--                   multiplies the bucket's limit (_lib.lua: load)
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
-- A 429 cuts the share by a tenth at once (cut_share).

local SHARE_MIN, SHARE_WINDOW_US, SHARE_CALLS, SHARE_LATE = 0.05, 2e6, 5, 4
local SHARE_GAIN, SHARE_NOISE, SHARE_CUT = 0.5, 0.03, 0.9

local function judge_window(d, limit)
  local left = (d.r1 - d.r0 + d.u0) / (d.t1 - d.t0) / (limit / 60e6)
  local share = d.share
  if d.x0 >= 0.9 * d.top then
    share = math.max(share + (d.t1 - d.t0) / 60e6, left)
  elseif left > share or left < share - SHARE_NOISE then
    share = share + SHARE_GAIN * (left - share)
  end
  return share
end

-- A response's headers: its -remaining against the key's -limit, per dimension.
local function learn_share(b, headers, now)
  if not b.learning then return end
  local lat = b.sh.lt or 0
  for k = 1, 3 do
    local d = b.sh[k]
    local rem, limit = headers.remaining[DIMS[k]], headers.limit[DIMS[k]]
    if b.per[k] and rem and limit and limit > 0 then
      b.sh.changed = true
      -- full: the most seen, and at least our own burst's worth of the key's limit
      d.top = math.max(d.top or limit / 60 * b.burst_s, rem)
      if not d.t1 or now < d.t1 then  -- a first header
        d.r0, d.t0, d.u0, d.x0 = nil, nil, nil, nil
        d.r1, d.t1, d.u1, d.x1 = rem, now, 0, rem
      else
        local share = d.share
        d.x1 = math.max(d.x1, rem)
        if d.t0 and now - d.t1 >= SHARE_LATE * lat then
          share = judge_window(d, limit)
          d.r0, d.t0, d.u0, d.x0 = nil, nil, nil, nil
        end
        if now - d.t1 >= math.max(SHARE_WINDOW_US, SHARE_CALLS * lat) then
          share = math.max(share, (rem - d.r1 + d.u1) / (now - d.t1) / (limit / 60e6))
          d.r0, d.t0, d.u0, d.x0 = d.r1, d.t1, d.u1, d.x1
          d.r1, d.t1, d.u1, d.x1 = rem, now, 0, rem
        end
        d.share = math.min(1, math.max(SHARE_MIN, share))
        set_limit(b, k, b.base[k] * d.share)
      end
    end
  end
end

-- A settled call: what the provider admitted of it counts in the window it was sent in (a
-- call that used no tokens was refused; one sent before the first window began is in its
-- -remaining already), and its time from send to settle in the mean, which sets how long a
-- window lasts.
local function count_use(b, sent_at, used, now)
  if not b.learning or used[2] + used[3] == 0 then return end
  local s = b.sh
  local took = math.max(0, now - sent_at)
  s.lt = s.lt and s.lt + 0.1 * (took - s.lt) or took
  s.changed = true
  for k = 1, 3 do
    local d = s[k]
    if b.per[k] and d.t1 and sent_at >= d.t1 then
      d.u1 = d.u1 + used[k]
    elseif b.per[k] and d.t0 and sent_at >= d.t0 then
      d.u0 = d.u0 + used[k]
    end
  end
end

-- A 429: the provider refused what we planned with, so our share was less.
local function cut_share(b)
  if not b.learning then return end
  for k = 1, 3 do
    if b.tat[k] then
      b.sh[k].share = math.max(SHARE_MIN, b.sh[k].share * SHARE_CUT)
      set_limit(b, k, b.base[k] * b.sh[k].share)
      b.sh.changed = true
    end
  end
end
