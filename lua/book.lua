-- book.lua: turn a live hold into a sale in Redis (the booking then goes to Kafka).
--
-- KEYS[1..4]  the show keys (see show_lib.lua)
-- KEYS[5]     the show's intents (zset: hold id -> ms marked; publication not known yet)
-- ARGV[1]     hold id
-- ARGV[2]     ticket (only the holder may book)
-- ARGV[3]     now, ms
-- ARGV[4]     booking id (derived from the hold id, so a retry names the same booking)
-- ARGV[5]     this attempt's id: a fresh mark records it, and unbook.lua undoes only the attempt
--             that names it (an undo retried late, onto a promoted replica, must not undo a
--             later attempt's mark of the same booking that was answered 201)
--             A repeat clears it: from then on no attempt can undo the mark (a repeat may be
--             answered 201 on it while the first attempt, still waiting for its replica, fails)
-- Returns     {1, hold JSON}   marked sold now
--             {2, hold JSON}   this hold was booked before (the same booking: idempotent)
--             {0}              no live hold: never made, lapsed, released, or one of its
--                              seats given by reconciliation to a sale the ledger holds
--             {-1}             another ticket's hold
--
-- The hold leaves the expiry set: a booked hold no longer lapses. A fresh mark records an
-- intent: the booking must now reach the ledger (the service publishes it and then drops the
-- intent; if it cannot, the admission leader's sweeper publishes it again). unbook.lua puts the
-- hold back only when the booking was never published.
sweep(ARGV[3])
local raw = redis.call('HGET', KEYS[4], ARGV[1])
if not raw then return {0} end
local h = cjson.decode(raw)
if h.ticket ~= ARGV[2] then return {-1} end
if h.booking then
  -- A repeat adopts the mark: the fresh attempt's undo (unbook.lua) no longer matches it, so a
  -- 201 given to this confirmation can never be taken back by the other one.
  if h.attempt then
    h.attempt = nil
    raw = cjson.encode(h)
    redis.call('HSET', KEYS[4], ARGV[1], raw)
  end
  return {2, raw}
end
local n
if h.seats then
  -- A seat that reconciliation gave to a sale PostgreSQL already holds is no longer this hold's:
  -- the hold is over (the rest of its seats go back).
  for _, s in ipairs(h.seats) do
    if redis.call('HGET', KEYS[2], s) ~= 'h:' .. ARGV[1] then
      local back = 0
      for _, t in ipairs(h.seats) do
        if redis.call('HGET', KEYS[2], t) == 'h:' .. ARGV[1] then
          redis.call('HSET', KEYS[2], t, '')
          back = back + 1
        end
      end
      redis.call('HINCRBY', KEYS[1], 'available', back)
      redis.call('HDEL', KEYS[4], ARGV[1])
      redis.call('ZREM', KEYS[3], ARGV[1])
      return {0}
    end
  end
  for _, s in ipairs(h.seats) do
    redis.call('HSET', KEYS[2], s, 's:' .. ARGV[4])
  end
  n = #h.seats
else
  n = h.quantity
end
redis.call('HINCRBY', KEYS[1], 'sold', n)
redis.call('HINCRBY', KEYS[4], 'taken:' .. h.ticket, n)
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZADD', KEYS[5], ARGV[3], ARGV[1])
h.booking = ARGV[4]
h.attempt = ARGV[5]
raw = cjson.encode(h)
redis.call('HSET', KEYS[4], ARGV[1], raw)
return {1, raw}
