-- _lib.lua: what every script uses; prepended after the clock (_clock.lua) and the counter
-- names (STAT_FIELDS, from _scripts.py), before the parts a script names in its
-- "-- Preamble:" line (_bucket.lua, _share.lua, _stats.lua).
--
-- One scope's keys, in the order LimiterCore.keys() lists them, all under its hash tag
-- {prefix}:{scope}:
--   bucket  hash  per dimension d (DIMS, from _scripts.py's table: r, i, o, t = requests,
--                 input tokens, output tokens, tokens: input and output in one bucket)
--                 d: the theoretical arrival time (GCRA), us of Redis time: the instant its
--                 bucket is full again, all reservations paid; absent or past = full. Ld: the
--                 per-minute limit of the last write, before our share (absent = not
--                 limited). And burst: burst_s of the last write; cd: cooldown until (us);
--                 lx: the latest lease expiry (us); ls: when the last send left, paced
--                 where the bucket holds less than one request (hold_back.lua; us, 0: none);
--                 tw: how many times an output token counts in t (absent: once; Bedrock's
--                 output burndown: 5); st: as so, that weighted tokens bucket (tw set
--                 only);
--                 so: the output bucket as the provider holds it, of the calls that went
--                 out only: the instant it is full again (us, 0: none yet), debited by
--                 each send's output reservation (hold_back.lua), which its settle
--                 replaces with the answer; sr: the request bucket as the provider
--                 holds it, of the sends as they left (hold_back.lua; us, 0: none yet);
--                 si: the same of the input bucket, each send debiting its input
--                 reservation (a prompt larger than the bucket waits until it is full);
--                 ar, ai: when the next paced send, the next prompt larger than the input
--                 bucket may go by the provider's admission of the last one (its stream's
--                 headers: admitted.lua; a send not reported: the limiter's interval
--                 after it left, hold_back.lua; us); lu: learned_utilization (the limits
--                 are the provider's x lu; absent: 1; a bucket of less than one request
--                 plans its requests at Lr / lu, _bucket.lua)
--   leases  zset  lease id -> expiry (us)
--   learned hash  d: raw per-minute limits from -limit headers (kept 24 h)
--   stats   hash  "<second>:<field>" -> count (STAT_FIELDS, from _scopes.py; _stats.lua)
--   statidx zset  the seconds present in stats, to prune old ones
--   share   hash  what learn_share knows of our share of the key (see _share.lua)
--
-- ARGV[1] is each script's one JSON argument (ARGV[2], with a test clock, the time). A
-- script on a scope has in it
--   limits   {per_min = {d = per-minute limit (absent = not configured: the learned limit x
--            learned_utilization if any, else unlimited)}, tw: the weight of output tokens
--            in t (absent: 1), burst_s, learned_utilization,
--            learn_share: learn our share of the key from the headers (see _share.lua)};
--            absent = the limits of the last write (release, state)
--   headers  {remaining = {d = n}, limit = {d = n}}: a response's -remaining and -limit
--            headers, each absent where the response had none
-- Numbers leave the scripts as strings: Redis would truncate them.

local A = cjson.decode(ARGV[1])

local function num(x) return string.format('%.17g', x) end

-- A call's count per dimension: requests, input and output tokens, and both together (t:
-- a provider's one tokens bucket, OpenAI's and Bedrock's). A scope debits the dimensions it
-- limits. m: the call's max tokens, the most output a tokens bucket may be charged for
-- (absent: a settle's count, or a call with no such floor); _bucket.lua's `costed` weighs
-- t for a bucket whose output counts several times (Bedrock's burndown).
local function per_dim(r, i, o, m) return {r = r, i = i, o = o, t = i + o, m = m} end

-- Append a field and its number to an HSET argument list.
local function put(list, field, x)
  table.insert(list, field); table.insert(list, num(x))
end

-- A hash as a table of numbers by field.
local function hash(key)
  local flat, t = redis.call('HGETALL', key), {}
  for j = 1, #flat, 2 do t[flat[j]] = tonumber(flat[j + 1]) end
  return t
end

-- A request bucket of less than one request (60 RPM in 1 s bursts): its sends are paced one
-- by one on when the last one left and was admitted (hold_back.lua, admitted.lua), and its
-- requests are planned at the provider's full rate (_bucket.lua).
local function paced_scope(rpm, burst_s)
  return rpm ~= nil and burst_s ~= nil and rpm * burst_s < 60
end

-- The six keys of the scope whose first key is KEYS[first].
local function scope_keys(first)
  return {bucket = KEYS[first], leases = KEYS[first + 1], learned = KEYS[first + 2],
          stats = KEYS[first + 3], statidx = KEYS[first + 4], share = KEYS[first + 5]}
end
