-- unbook.lua: undo book.lua for a booking that was never published (its sold mark did not reach
-- a replica): the seats go back to the hold (which lapses at its original expiry), nothing stays
-- sold. Never used for a booking whose publication was attempted: its outcome is the ledger's.
--
-- KEYS[1..4]  the show keys (see show_lib.lua)
-- KEYS[5]     the show's intents
-- ARGV[1]     hold id
-- ARGV[2]     booking id
-- ARGV[3]     the attempt's id (book.lua's ARGV[5]): only that attempt's mark is undone. The
--             cluster client retries a command whose node died; an undo retried onto the promoted
--             replica must not undo the mark a later attempt of the same booking made there,
--             nor a mark a repeated confirmation has adopted (book.lua clears the attempt).
-- Returns     1 undone; 0 nothing to undo (the hold is not booked: the mark was lost with a
--             failed primary, or never made); 2 not undone: the booking's mark is another
--             attempt's, or a repeated confirmation or the sweeper adopted it
local raw = redis.call('HGET', KEYS[4], ARGV[1])
if not raw then return 0 end
local h = cjson.decode(raw)
if h.booking ~= ARGV[2] then return 0 end
if h.attempt ~= ARGV[3] then return 2 end
local n
if h.seats then
  for _, s in ipairs(h.seats) do
    if redis.call('HGET', KEYS[2], s) == 's:' .. ARGV[2] then
      redis.call('HSET', KEYS[2], s, 'h:' .. ARGV[1])
    end
  end
  n = #h.seats
else
  n = h.quantity
end
redis.call('HINCRBY', KEYS[1], 'sold', -n)
redis.call('HINCRBY', KEYS[4], 'taken:' .. h.ticket, -n)
h.booking = nil
h.attempt = nil
redis.call('HSET', KEYS[4], ARGV[1], cjson.encode(h))
redis.call('ZADD', KEYS[3], h.expires, ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
return 1
