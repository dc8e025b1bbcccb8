-- _save.lua: a fragment, included in save() (_lib.lua) and in place in acquire.lua: write
-- the bucket h back (h and now are the includer's). Its TTL is only ever extended, with
-- slack, so PEXPIRE runs about once a minute rather than on every call (a longer life is
-- harmless: the state stays exact, an expired bucket would merely have been full).
do
  -- How long the bucket must live: long enough that an expired bucket would be full
  -- anyway, and as long as the lease set (whose expiry it keeps).
  local need = max(h[T], h[CD])
  if h[LX] == h[LX] then need = max(need, h[LX]) end
  for k = 1, 3 do
    local rate = RATE[k]
    if rate then
      local cap = CAP[k]
      need = max(need, h[T] + (cap - h[k]) / rate * 1e6)
      local q = h[SQ + k]
      if q == q then need = max(need, q + (cap - h[SS + k]) / rate * 1e6) end
    end
  end
  need = need + MARGIN_S * 1e6
  local extend = not (h[X] >= need)  -- also when absent (NaN)
  if extend then h[X] = need + TTL_SLACK_US end
  call('SET', KEYS[1], pack(REC, unpack(h, 1, NREC)), 'KEEPTTL')
  if extend then
    call('PEXPIRE', KEYS[1], format('%d', ceil((h[X] - now) / 1000)))
  end
end
