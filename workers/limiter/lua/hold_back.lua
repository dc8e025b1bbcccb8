-- hold_back.lua: right before a call that waited for its planned send goes out, is a
-- cooldown holding now on a scope its grant reserved in? A 429 that came while it waited
-- said the provider's bucket is empty, which the reservation, planned before, knew nothing
-- of (cooldown.lua holds back only the grants made after it). If so, the grant's lease goes
-- (the call will not go out on it) but its reservation stays debited: the provider's refill
-- during the cooldown is not ours to plan with (cooldown.lua empties the level at its end),
-- and a refund would let the call, planned again, take the place of a call granted before
-- the 429 for after the cooldown: two sends for one place (measured: 13 sends planned for
-- one instant after a cooldown, 7 of them 429s).
-- A pool's key disabled while the call waited (a 401/403 on another worker) holds it back
-- the same way, for good: the call moves to another key instead of being refused too.
-- Else, where the limiter's request bucket holds less than one request (60 RPM in 1 s
-- bursts), the provider's bucket admits the next send one interval after the last one
-- *left*, whenever that was planned: a send that left late by more than the planner's
-- slack (5 % of the interval) drew a 429 on the next. So the sends there are paced on when
-- each left (the bucket's `ls`, set here as the grant goes), not on planned times alone.
-- Where it holds more, the provider's request bucket is kept of the sends as they left
-- (`sr`, at the limiter's own capacity, as `so` below): the grants were planned to go at
-- their slots, and a send that leaves late while the provider's bucket is full banks none
-- of the refill it waited through, so sends that a stall of the sender (a loaded host, a
-- loop busy for 0.3 s) held back all leave together at its end, more than the bucket holds
-- (replayed through the simulator's bucket, a gateway's 211 sends into 900 RPM: a stall
-- of 0.3 s drew one 429, of 0.5 s four). A send waits while that bucket has no room for it;
-- on time, it always has (the grants fit the same bucket).
-- And where a scope limits output tokens: the provider admits a request while its output
-- bucket has room (level > 0) and debits each answer as it is generated, whatever drover
-- reserved for it. The grants were planned on the output estimates; an answer longer than
-- its reservation is trued up at its settle, but the calls granted before that settle were
-- planned without it and went out into a provider bucket in debt (bench.small_keys --mix:
-- a block of long answers after short ones drew four 429s on output tokens). So the bucket
-- keeps that provider bucket too, of the calls that went out only (`so`: it is full again
-- then; debited here by each send's output reservation, which settle.lua replaces with the
-- answer), at the limiter's own (smaller) capacity and the limit before any share; a send
-- waits while it is in debt, and each send that goes moves the next ones back.
-- A paced send (of a bucket of less than one request, or a prompt larger than the input
-- bucket) waits also until one interval of the provider's, at its full rate, after the
-- response headers of the last paced send came back (`ar`; `ai`: the refill of the last
-- oversized prompt's input, for the next oversized one; admitted.lua). The pacing on `ls`
-- sees when a send left the check, not when it reached the provider: a send that took 0.06 s
-- longer from its check to the provider than the next one did had the next refused
-- (bench.small_keys --mix at loads over 8). A stream's headers come at its admission, so
-- their arrival is an upper bound on it. A send whose headers never come sets neither: it
-- holds nothing, and the pacing on `ls` and `si` stands alone as before. With that bound,
-- a bucket of less than one request is planned, and paced on `ls`, at the provider's full
-- rate (_bucket.lua's `load`); a send whose caller will not report its headers sets `ar`
-- to the limiter's interval (the target's) after it left: the tolerance of its way there.
-- KEYS[2i - 1], KEYS[2i]  the bucket hash and the leases of scope i (the one key's; a
--                         pool's organisation and key: one hash tag)
-- The one key stopped fleet-wide (its spend limit: workers/agent/spend_limit.py) is read
-- here too (ARGV's stop), so that a send asks Redis once: 'inf', and nothing changes (the
-- caller reads why, releases the grant and sends nothing). Its disabled-keys hash has the
-- pool's hash tag, not the scope's: the one script of a scope that spans two (on one Redis
-- primary, which is what drover runs on: docs/high-availability.md).
-- KEYS[last]              with ARGV's key (a pool's) or stop: the disabled keys (hash alias
--                         -> until, us)
-- ARGV[1]                 {lease: the grant's lease id, key: the pool key's alias (a pool's),
--                         stop: the one key's alias, out: the grant's output reservation,
--                         inp: its input reservation, m: its max tokens (absent: none),
--                         hdr: the caller reports the send's response headers (a stream:
--                         admitted.lua) when told to}
-- Returns the seconds (a string) the longest of those cooldowns still holds, a day for a
-- disabled key; minus the seconds until the paced send may go (ask again then); '0': none,
-- and the grant stands (called right before the send: it is its `ls`); 'paced': the same,
-- for a paced send whose caller said hdr (report its headers' arrival: admitted.lua);
-- 'inf': stop's key is stopped.

local scopes = (A.key or A.stop) and #KEYS - 1 or #KEYS
local function off_key(alias)
  return tonumber(redis.call('HGET', KEYS[#KEYS], alias) or '0') > now
end
if A.stop and off_key(A.stop) then return 'inf' end
local off = A.key and off_key(A.key)
local until_us, due, paced, spent = off and now + 86400 * 1e6 or now, now, {}, {}
local admitted = false  -- paced on its admission (`ar`, `ai`: admitted.lua) in some scope
for i = 1, scopes, 2 do
  local f = hash(KEYS[i])
  until_us = math.max(until_us, f.cd or 0)
  if paced_scope(f.Lr, f.burst) then
    due = math.max(due, (f.ls or 0) + 60e6 * (f.lu or 1) / f.Lr, f.ar or 0)
    table.insert(paced, {KEYS[i], 60e6 / f.Lr, f.ar or 0})
    admitted = true
  elseif f.Lr then
    local sr = f.sr or 0
    due = math.max(due, sr + 60e6 / f.Lr - f.burst * 1e6)
    spent[KEYS[i] .. ':r'] = {'sr', math.max(sr, now) + 60e6 / f.Lr, KEYS[i]}
  end
  if f.Lo and (A.out or 0) > 0 then
    local so = f.so or 0
    due = math.max(due, so - f.burst * 1e6)
    spent[KEYS[i]] = {'so', math.max(so, now) + A.out * 60e6 / f.Lo}
  end
  -- A prompt larger than the limiter's input bucket is admitted by the provider only into a
  -- full bucket: one refill of the last send's input after that send *left*, as at a bucket
  -- of one request; planned times alone left it the target's 5 % for a send that left late
  -- (bench.small_keys --mix: two 429s on input tokens in a run, 1.375 s after an admission
  -- of a 927-token prompt whose refill takes 1.39 s). So the bucket keeps the input bucket of
  -- the calls that went out too (`si`, each send's input reservation, at the limiter's rate
  -- and bucket), and such a send waits until it is full; smaller sends only debit it.
  if f.Li and (A.inp or 0) > 0 then
    local si, per = f.si or 0, 60e6 / f.Li
    if A.inp * per > f.burst * 1e6 then due = math.max(due, si, f.ai or 0); admitted = true end
    spent[KEYS[i] .. ':i'] = {'si', math.max(si, now) + A.inp * per, KEYS[i]}
  end
  -- A weighted tokens quota (Bedrock's: input + max tokens at admission, input + 5 x output
  -- once done) is kept the same way, of the calls that went out (`st`): an answer longer
  -- than its admission takes the difference when it is done, which the grants planned
  -- before its settle knew nothing of (bench.clouds: one throttle a run on Bedrock's 1 s
  -- quota, mid-job, without this).
  if f.Lt and f.tw and (A.inp or 0) > 0 then
    local st, took = f.st or 0, A.inp + math.max(f.tw * (A.out or 0), A.m or 0)
    due = math.max(due, st - f.burst * 1e6)
    spent[KEYS[i] .. ':t'] = {'st', math.max(st, now) + took * 60e6 / f.Lt, KEYS[i]}
  end
end
if until_us > now then
  for i = 2, scopes, 2 do redis.call('ZREM', KEYS[i], A.lease) end
elseif due > now then return num((now - due) / 1e6)
else
  for _, p in ipairs(paced) do
    local set = {}
    put(set, 'ls', now)
    -- A send whose headers will not be reported keeps the next one the limiter's interval
    -- (the target's) after it left: the tolerance of its way to the provider, unseen
    if not A.hdr then put(set, 'ar', math.max(p[3], now + p[2])) end
    redis.call('HSET', p[1], unpack(set))
  end
  for key, s in pairs(spent) do redis.call('HSET', s[3] or key, s[1], num(s[2])) end
  if admitted and A.hdr then return 'paced' end
end
return num((until_us - now) / 1e6)
