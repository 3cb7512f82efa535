-- release_hold.lua: give a hold back before it lapses.
--
-- KEYS[1..4]  the show keys (see show_lib.lua)
-- ARGV[1]     hold id
-- ARGV[2]     ticket (only the holder may release)
-- ARGV[3]     now, ms
-- Returns     {1, available} released; {0} no such hold (never made, lapsed or released);
--             {-1} another ticket's hold; {-2} already booked
sweep(ARGV[3])
local raw = redis.call('HGET', KEYS[4], ARGV[1])
if not raw then return {0} end
local h = cjson.decode(raw)
if h.ticket ~= ARGV[2] then return {-1} end
if h.booking then return {-2} end
if h.seats then
  -- Only seats that still say this hold go back: a seat the ledger's verdict or a repair has
  -- set since (sold to a booking, say) is not this hold's to free.
  local freed = 0
  for _, s in ipairs(h.seats) do
    if redis.call('HGET', KEYS[2], s) == 'h:' .. ARGV[1] then
      redis.call('HSET', KEYS[2], s, '')
      freed = freed + 1
    end
  end
  redis.call('HINCRBY', KEYS[1], 'available', freed)
else
  redis.call('HINCRBY', KEYS[1], 'available', h.quantity)
end
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return {1, available()}
