-- Fair share of one queue's dispatch window: which job's next sub-agents go to the broker.
--
-- KEYS[1]  hash   job id -> cjson {n, next, done, deferred, tenant, w, rank, seq, t0} of every
--                 job that still has sub-agents out or waiting (n: sub-agents, next: first
--                 index not yet published, done: records in, deferred: out but waiting out a
--                 retry countdown, w: tenant weight, rank: 0 interactive, 1 normal, 2 batch,
--                 seq: arrival order, t0: Redis time of its arrival, calls: 1 for a
--                 process's calls job, see below)
-- KEYS[2]  string arrival counter
-- KEYS[3]  hash   tenant -> cjson {a, t}: its recent average of sub-agents out (a) as of t
-- KEYS[4]  hash   "job id|first|count" -> "holder|time": grants not yet published
-- KEYS[5]  set    the op's job's deferred sub-agents (their indexes), so that a defer or a
--                 resume counts once per sub-agent however many copies of its task say so
-- KEYS[6]  string the line cap: sub-agents allowed out over all jobs *including* deferred
--                 ones, because the limiter can serve about that many within its horizon
--                 (absent: no such cap; see fairshare.py, "waiting in line"). Read here, not
--                 passed in: a copy a caller read a moment ago may predate the cap of the job
--                 that was just submitted, and one such grant publishes a whole window
-- KEYS[7]  string the lease cap: the limiter's in-flight leases of the line's scopes
--                 (DROVER_MAX_IN_FLIGHT per model class; absent: none). While calls of a
--                 calls job are waiting or out, calls out plus the fleet's running
--                 sub-agents stay within it: a call holds its lease from its booking to its
--                 settle, so a place beyond it would poll for a lease, first come first
--                 served, not in this rule's order
-- ARGV[1]  op: add | done | defer | resume | undefer | remove | fill | enter | leave | withdraw
-- ARGV[2]  window: sub-agents allowed out (in the broker or running) over all jobs
-- ARGV[3]  floor: least share of a tenant's window for each waiting level below its highest
-- ARGV[4]  ttl of KEYS[1], KEYS[3] and KEYS[4] in seconds
-- ARGV[5]  seconds over which a tenant's average out is taken
-- ARGV[6]  holder: the caller's worker id ("" outside a worker), who publishes the grants
-- ARGV[7]  job id (not for fill)
-- add:  ARGV[8] n, ARGV[9] tenant, ARGV[10] weight, ARGV[11] rank
-- done: ARGV[8] records of the job now in (the job store's count; only raises `done`)
-- defer, resume: ARGV[8] the sub-agent's index
-- undefer: ARGV[8..] indexes that are not waiting out a countdown any more (the sweep's
--          reconciliation: they have a record, run, or their worker died); grants nothing
-- enter: ARGV[8] tenant, ARGV[9] weight, ARGV[10] rank, ARGV[11] calls (usually 1): that
--          many calls of a process outside the fleet (the gateway's) join its calls job
-- leave: a call of the calls job ended: its place is free
-- withdraw: a call of the calls job left before its place (its caller went away)
--
-- A *calls job* (id "calls:<process>:<tenant>") stands for one process's calls of one tenant
-- that come from outside the fleet (drover gateway's callers): each call is one "sub-agent"
-- that waits in the process, not in a broker, until the job's `next` passes its turn, and
-- leaves when its answer is settled. It shares the line as any job of its tenant does (same
-- weight, level and rule), but it holds no worker slot: it counts against the line cap only,
-- and with no line cap (the key is not the bottleneck, or the line is off) its calls go at
-- once. Its calls and the fleet's running sub-agents together hold at most the lease cap
-- (KEYS[7]), with or without a line cap, so that a place is a call that can go: a call
-- beyond the leases would poll the limiter for one, and whoever polls first wins, whatever
-- this rule said. While calls wait or are out, a fleet sub-agent's place needs a free lease
-- too (counted as running: one call at a time, its lease while it is booked or answering),
-- so the leases are shared by the same rule. Nothing of it is published: its grants are not listed in KEYS[4]. It stays in
-- KEYS[1] while its process lives (its counters only grow, so the process can compare), and
-- the pump removes it once the process's liveness key is gone. The calls ops return the
-- job's `next` and, for withdraw, 1 when the call had been granted its place (then freed
-- here) or 0, before the grants.
--
-- Returns {job id, first index, count, ...}: the sub-agents the caller must publish now.
-- Each grant is also written to KEYS[4] until the caller says it published it: a caller
-- that dies in between (kill -9 between this call and the publish) would otherwise leave
-- sub-agents counted as published that no broker has; the pump publishes them again.
--
-- The rule (max-min fairness of the window, three levels): give the next free place to a
-- tenant with sub-agents waiting and fewer out than its due (the window, less what tenants
-- with nothing waiting hold, split by weight; rounded up), the one furthest below its due on
-- average over the last seconds (a window of 16 cannot split 2:1 at any instant: taking the
-- average makes the tenants take turns with the odd place, so the split holds over time);
-- with none below its due, to the least out per weight. Inside the tenant, to
-- the waiting priority level with the least out per level weight (the highest waiting level
-- weighs 1 - floor x (levels waiting - 1), each lower one floor); inside the level, to the job
-- with the least out (the oldest on a tie). It looks only at what is out now, so it needs no
-- history, and a job that arrives is served at the next free place.
-- A sub-agent waiting out a retry countdown (the limiter said later, a tenant's budget is
-- spent) holds no worker slot: it still counts for its job's share, not for the window, so
-- the others can use the slot; its job, being at its share, gets no more meanwhile.

local op, window, floor, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local TAU, holder, id = tonumber(ARGV[5]), ARGV[6], ARGV[7]
local cap = tonumber(redis.call('GET', KEYS[6]) or 0) or 0
local leases = tonumber(redis.call('GET', KEYS[7]) or 0) or 0
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1e6

local jobs, by_id = {}, {}
local raw = redis.call('HGETALL', KEYS[1])
for i = 1, #raw, 2 do
  local job = cjson.decode(raw[i + 1])
  job.id = raw[i]
  job.deferred = job.deferred or 0
  jobs[#jobs + 1] = job
  by_id[job.id] = job
end

-- The lease cap binds while a calls job has calls waiting or out (else it never binds:
-- the fleet's own sub-agents beyond the leases poll for them among themselves, as always).
local function calls_busy()
  if leases > 0 then
    for _, j in ipairs(jobs) do
      if j.calls and j.n > j.done then return true end
    end
  end
  return false
end
-- Calls take part in the rule when something bounds them: a line cap or the leases (as of
-- now for the averages, as of after the op for the grants below).
local leased = calls_busy()
local bounded = cap > 0 or leased

-- Each tenant's average out, brought up to now with what it held since the last call.
local averages = {}
do
  local held = {}
  for _, j in ipairs(jobs) do
    if bounded or not j.calls then
      held[j.tenant] = (held[j.tenant] or 0) + math.max(0, j.next - j.done)
    end
  end
  local stored = redis.call('HGETALL', KEYS[3])
  for i = 1, #stored, 2 do
    local name, entry = stored[i], cjson.decode(stored[i + 1])
    if held[name] then
      local keep = math.exp(-math.max(0, now - entry.t) / TAU)
      averages[name] = entry.a * keep + held[name] * (1 - keep)
    else
      redis.call('HDEL', KEYS[3], name)  -- gone: it starts afresh when it comes back
    end
  end
  for name, _ in pairs(held) do
    averages[name] = averages[name] or 0
    redis.call('HSET', KEYS[3], name, cjson.encode({a = averages[name], t = now}))
  end
end

local function save(job)
  local copy = {n = job.n, next = job.next, done = job.done, deferred = job.deferred,
                tenant = job.tenant, w = job.w, rank = job.rank, seq = job.seq, t0 = job.t0,
                calls = job.calls}
  redis.call('HSET', KEYS[1], job.id, cjson.encode(copy))
end

local function forget(job)
  redis.call('HDEL', KEYS[1], job.id)
  redis.call('DEL', KEYS[5])
  by_id[job.id] = nil
  for i, other in ipairs(jobs) do
    if other == job then table.remove(jobs, i) break end
  end
end

local function out(job)
  return math.max(0, job.next - job.done)
end

local function running(job)
  return math.max(0, out(job) - job.deferred)
end

local grants = {}
local function grant(job, first, count)
  grants[#grants + 1] = job.id
  grants[#grants + 1] = first
  grants[#grants + 1] = count
  if not job.calls then  -- a calls job's caller is waiting for it: nothing to publish
    redis.call('HSET', KEYS[4], job.id .. '|' .. first .. '|' .. count, holder .. '|' .. now)
  end
end

local job = by_id[id]
if op == 'add' then
  if not job then  -- a second add (a launch delivered twice) changes nothing
    job = {id = id, n = tonumber(ARGV[8]), next = 0, done = 0, deferred = 0, tenant = ARGV[9],
           w = tonumber(ARGV[10]), rank = tonumber(ARGV[11]),
           seq = redis.call('INCR', KEYS[2]), t0 = now}
    jobs[#jobs + 1] = job
    by_id[id] = job
    save(job)
  end
elseif op == 'done' and job then
  job.done = math.max(job.done, tonumber(ARGV[8]))
  job.deferred = math.min(job.deferred, out(job))
  if job.done >= job.n then forget(job) else save(job) end
elseif op == 'defer' and job then
  if redis.call('SADD', KEYS[5], ARGV[8]) == 1 then
    redis.call('EXPIRE', KEYS[5], ttl)
    job.deferred = math.min(job.deferred + 1, out(job))
    save(job)
  end
elseif op == 'resume' and job then
  if redis.call('SREM', KEYS[5], ARGV[8]) == 1 then
    job.deferred = math.max(0, job.deferred - 1)
    save(job)
  end
elseif op == 'undefer' and job then
  for i = 8, #ARGV do redis.call('SREM', KEYS[5], ARGV[i]) end
  -- The count follows the set (a lost update of either heals here too).
  job.deferred = math.min(redis.call('SCARD', KEYS[5]), out(job))
  save(job)
elseif op == 'remove' and job then
  forget(job)
elseif op == 'enter' then
  if not job then
    job = {id = id, n = 0, next = 0, done = 0, deferred = 0, tenant = ARGV[8],
           w = tonumber(ARGV[9]), rank = tonumber(ARGV[10]),
           seq = redis.call('INCR', KEYS[2]), t0 = now, calls = 1}
    jobs[#jobs + 1] = job
    by_id[id] = job
  end
  job.n = job.n + tonumber(ARGV[11])
  save(job)
elseif op == 'leave' and job then
  job.done = math.min(job.done + 1, job.next)
  save(job)
end
local withdrawn = 0
if op == 'withdraw' and job then
  if job.n > job.next then  -- still waiting: it leaves the line
    job.n = job.n - 1
  else  -- granted meanwhile (its process had not seen it yet): the place is free again
    withdrawn = 1
    job.done = math.min(job.done + 1, job.next)
  end
  save(job)
end

-- The sweep's reconciliation publishes nothing itself (it knows no broker): the places it
-- handed back go out at the pump's next fill, within seconds.
if op == 'undefer' then return {} end

-- A calls job needs no worker slot, only a place in the line and a lease: with neither
-- bounded every call waiting goes at once (nothing scarce to share), and calls jobs take no
-- part below.
leased = calls_busy()
bounded = cap > 0 or leased
local pending = {}  -- job id -> {first, count} granted in this call
local active = {}
for _, j in ipairs(jobs) do
  if j.calls and not bounded then
    if j.next < j.n then
      pending[j.id] = {j.next, j.n - j.next}
      j.next = j.n
    end
  else
    active[#active + 1] = j
  end
end

-- One place at a time, each to the most deserving waiting job.
local total, all_out, calls_held = 0, 0, 0
for _, j in ipairs(active) do
  if j.calls then calls_held = calls_held + out(j) else total = total + running(j) end
  all_out = all_out + out(j)
end
local free_slots = window - total
-- The leases: each call out holds one, each running sub-agent at most one.
local free_leases = math.huge
if leased then free_leases = leases - total - calls_held end
-- The limiter's line: beyond what it can serve within its horizon a sub-agent would only
-- wait out a countdown, so it waits here, unpublished, in the order this rule gives.
local free_line = math.huge
if cap > 0 then free_line = cap - all_out end
while free_line > 0 do
  local tenants = {}
  local calls_out = 0
  for _, j in ipairs(active) do
    local t = tenants[j.tenant]
    if not t then
      t = {out = 0, w = j.w, waiting = false, seq = j.seq, levels = {}}
      tenants[j.tenant] = t
    end
    t.out = t.out + out(j)
    if j.calls then calls_out = calls_out + out(j) end
    t.w = math.max(t.w, j.w)
    t.seq = math.min(t.seq, j.seq)
    local level = t.levels[j.rank]
    if not level then
      level = {out = 0, waiting = {}}
      t.levels[j.rank] = level
    end
    level.out = level.out + out(j)
    -- a sub-agent also needs a worker slot; a call only its place in the line; both a lease
    if j.next < j.n and (j.calls or free_slots > 0) and free_leases > 0 then
      t.waiting = true
      level.waiting[#level.waiting + 1] = j
    end
  end
  local weights, spare, deferred = 0, window + calls_out, 0
  for _, j in ipairs(active) do deferred = deferred + j.deferred end
  spare = spare + deferred
  if cap > 0 then spare = math.min(spare, cap) end
  -- a sub-agent waiting out a countdown holds no lease, but its place
  if leased then spare = math.min(spare, leases + deferred) end
  for _, t in pairs(tenants) do
    if t.waiting then weights = weights + t.w else spare = spare - t.out end
  end
  local best, best_key, best_seq = nil, nil, nil
  for name, t in pairs(tenants) do  -- below its due: furthest below it on average
    local due = spare * t.w / math.max(weights, 1e-9)
    if t.waiting and t.out < math.ceil(due - 1e-9) then
      local key = (averages[name] or 0) / math.max(due, 1e-9)
      if not best or key < best_key or (key == best_key and t.seq < best_seq) then
        best, best_key, best_seq = t, key, t.seq
      end
    end
  end
  if not best then  -- none below its due: the least out per weight
    for _, t in pairs(tenants) do
      if t.waiting then
        local key = t.out / t.w
        if not best or key < best_key or (key == best_key and t.seq < best_seq) then
          best, best_key, best_seq = t, key, t.seq
        end
      end
    end
  end
  if not best then break end
  local ranks = {}
  for rank, level in pairs(best.levels) do
    if #level.waiting > 0 then ranks[#ranks + 1] = rank end
  end
  table.sort(ranks)
  local chosen, chosen_key = nil, nil
  for i, rank in ipairs(ranks) do
    local weight = floor
    if i == 1 then weight = 1 - floor * (#ranks - 1) end
    local key = best.levels[rank].out / weight
    if not chosen or key < chosen_key then chosen, chosen_key = best.levels[rank], key end
  end
  local pick = nil
  for _, j in ipairs(chosen.waiting) do
    if not pick or out(j) < out(pick) or (out(j) == out(pick) and j.seq < pick.seq) then
      pick = j
    end
  end
  local run = pending[pick.id]
  if run then
    run[2] = run[2] + 1
  else
    pending[pick.id] = {pick.next, 1}
  end
  pick.next = pick.next + 1
  free_line = free_line - 1
  free_leases = free_leases - 1
  if not pick.calls then free_slots = free_slots - 1 end
end
for _, j in ipairs(jobs) do
  local run = pending[j.id]
  if run then
    grant(j, run[1], run[2])
    save(j)
  end
end
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('EXPIRE', KEYS[3], ttl)
if #grants > 0 then redis.call('EXPIRE', KEYS[4], ttl) end
if op == 'enter' or op == 'leave' or op == 'withdraw' then
  local mine = by_id[id]
  local head = {mine and mine.next or 0, withdrawn}
  for _, g in ipairs(grants) do head[#head + 1] = g end
  return head
end
return grants
