-- adopt.lua: the sweeper takes over a booking of unknown outcome before it publishes it again.
-- The attempt that marked the seats may still be running (its commands can outlast the intent
-- grace in a failover) and may still try to undo its mark; once the sweeper publishes the
-- booking, the ledger will decide it, so that undo must no longer match (unbook.lua undoes only
-- the attempt the hold record names).
--
-- KEYS[1]  the show's hold records
-- ARGV[1]  hold id
-- Returns  the hold record (JSON), without an attempt, when the hold is booked; nil otherwise
--          (never booked, lapsed, or the attempt undid its mark first: nothing to publish)
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return false end
local h = cjson.decode(raw)
if not h.booking then return false end
if h.attempt then
  h.attempt = nil
  raw = cjson.encode(h)
  redis.call('HSET', KEYS[1], ARGV[1], raw)
end
return raw
