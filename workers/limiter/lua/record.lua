-- record.lua: add to this second's counters of a scope (e.g. the requests of a batch).
-- Preamble: _stats
-- KEYS[1..6]  the scope's (see _lib.lua)
-- ARGV[1]     {stats_window_s, counts: {STAT_FIELDS name = count}}

stat_add(scope_keys(1), math.floor(now / 1e6), A.counts)
return 1
