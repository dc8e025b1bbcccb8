-- sync.lua: fold a response's rate-limit headers into the scope.
-- Preamble: _bucket, _share
-- KEYS[1..6]  the scope's (see _lib.lua)
-- ARGV[1]     {limits, headers}: -remaining lowers a level, never raises it; -limit is
--             learned where no limit is configured, and is the key's limit when learning
--             our share of it (_share.lua: fold_headers)

save(fold_headers(scope_keys(1), A.limits, A.headers))
return 1
