-- settle.lua: align Redis with PostgreSQL's verdict on seats (the ledger is the truth).
-- Used for a rejected booking (its sold marks go) and by `waitroom reconcile --repair`.
--
-- KEYS[1..4]  the show keys (see show_lib.lua)
-- ARGV[1]     now, ms
-- ARGV[2..]   pairs: seat id, state ('' = AVAILABLE in PostgreSQL, 's:<booking>' = SOLD there),
--             optionally after '#rejected' and a booking id: then a seat is freed only while it
--             is still marked for that (rejected) booking — the ledger's '' was read before its
--             commit, and another applier may have sold the seat since;
--             or, for general admission, '#ga' and the quantity of a rejected booking;
--             or '#ga-sold', the `sold` reconcile read, and the ledger's sold (KEYS[5], the
--             show's intents, must be empty): `sold` becomes the ledger's and `available` moves
--             the other way, only if nothing changed since the read and no booking is in flight
-- Returns     number of seats whose state changed (#ga-sold: 1 done, -1 refused)
--
-- A seat now free in Redis but on hold is left to its hold only when PostgreSQL says it is
-- available; a seat sold in PostgreSQL always ends sold in Redis, whatever Redis thought.
sweep(ARGV[1])
if ARGV[2] == '#ga' then
  -- The ledger had fewer places than Redis thought: the rejected places are not sold, and they
  -- are not offered again either (PostgreSQL has no room for them): only `sold` goes down.
  local q = tonumber(ARGV[3])
  redis.call('HINCRBY', KEYS[1], 'sold', -q)
  return 0
end
if ARGV[2] == '#ga-sold' then
  local read, truth = tonumber(ARGV[3]), tonumber(ARGV[4])
  if redis.call('ZCARD', KEYS[5]) > 0 or tonumber(redis.call('HGET', KEYS[1], 'sold') or '0') ~= read then
    return -1
  end
  local avail = tonumber(redis.call('HGET', KEYS[1], 'available') or '0')
  redis.call('HSET', KEYS[1], 'sold', truth, 'available', math.max(0, avail - (truth - read)))
  return 1
end
local changed, avail_delta, sold_delta = 0, 0, 0
local first, only = 2, nil
if ARGV[2] == '#rejected' then
  first, only = 4, 's:' .. ARGV[3]
end
for i = first, #ARGV, 2 do
  local seat, truth = ARGV[i], ARGV[i + 1]
  local cur = redis.call('HGET', KEYS[2], seat)
  if cur then
    local cur_sold = string.sub(cur, 1, 2) == 's:'
    local cur_free = cur == ''
    if truth == '' then
      if cur_sold and (only == nil or cur == only) then
        redis.call('HSET', KEYS[2], seat, '')
        avail_delta = avail_delta + 1
        sold_delta = sold_delta - 1
        changed = changed + 1
      end
    elseif cur ~= truth then
      redis.call('HSET', KEYS[2], seat, truth)
      if cur_free then avail_delta = avail_delta - 1 end
      if not cur_sold then sold_delta = sold_delta + 1 end
      changed = changed + 1
    end
  end
end
if avail_delta ~= 0 then redis.call('HINCRBY', KEYS[1], 'available', avail_delta) end
if sold_delta ~= 0 then redis.call('HINCRBY', KEYS[1], 'sold', sold_delta) end
return changed
