-- _lib.lua: helpers of settle, cooldown, sync, state and record, prepended after _head.lua
-- (which describes the keys, the bucket record and the arguments). load(), peak() and
-- save() (and clock()) are the fragments _load.lua, _peak.lua and _save.lua (_clock.lua),
-- which acquire.lua includes in place instead (it defines no function).

local function fmt(x)
  return format('%.17g', x)
end

local function clock()
  local now = A[6]
  --#include _clock
  return now
end

local function load(now, raw)
  local h
  --#include _load
  return h
end

local function peak(h, k, s, v)
  --#include _peak
end

local function save(h, now)
  --#include _save
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

